"""Staged reads (edge_llm/model/staged_read.py): files read in chunks by several threads into
one buffer per file give the same tensors as safetensors, and a model loaded that way equals
the memory-mapped load and keeps no view of the read buffers."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from edge_llm.model.loader import load_model, staged_enabled
from edge_llm.model.staged_read import fits_staged, iter_tensors_staged, read_header
from tests.helpers import save_hf_checkpoint, tiny_hf_model
from tests.test_loader import _shard
from tests.test_model_quant_parity import CASES, _quantized_checkpoint


def _random_state(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "a.f32": torch.randn(37, 11, generator=gen),
        "b.f16": torch.randn(5, 3, generator=gen).half(),
        "c.bf16": torch.randn(129, generator=gen).bfloat16(),
        "d.i32": torch.randint(-2**31, 2**31 - 1, (64, 7), generator=gen, dtype=torch.int32),
        "e.i64": torch.randint(-1000, 1000, (13,), generator=gen),
        "f.u8": torch.randint(0, 255, (3, 3, 3), generator=gen, dtype=torch.uint8),
        "g.i8": torch.randint(-128, 127, (9,), generator=gen, dtype=torch.int8),
        "h.scalar": torch.tensor(3.5),
        "i.empty": torch.empty(0, 4),
    }


@pytest.mark.parametrize("chunk,threads", [(64, 3), (1000, 2), (1 << 20, 1), (7, 4)])
def test_staged_tensors_equal_safetensors(tmp_path, chunk, threads):
    files = []
    for i in range(2):
        files.append(tmp_path / f"part{i}.safetensors")
        save_file(_random_state(i), str(files[-1]))
    got = dict(iter_tensors_staged(files, torch.device("cpu"), chunk=chunk, threads=threads))
    want = {**load_file(str(files[0])), **load_file(str(files[1]))}
    assert set(got) == set(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t), name


def test_header_entries_are_in_data_order(tmp_path):
    file = tmp_path / "x.safetensors"
    save_file(_random_state(0), str(file))
    start, entries = read_header(file)
    begins = [e[3] for e in entries]
    assert begins == sorted(begins) and start > 8
    assert {e[0] for e in entries} == set(_random_state(0))


def test_unknown_dtype_is_refused_by_name(tmp_path):
    file = tmp_path / "x.safetensors"
    save_file({"w": torch.zeros(4, dtype=torch.float8_e4m3fn)}, str(file))
    with pytest.raises(ValueError, match="'w'.*F8_E4M3"):
        list(iter_tensors_staged([file], torch.device("cpu")))


def test_staged_enabled_choice():
    cpu = torch.device("cpu")
    assert not staged_enabled(None, cpu, 10)  # CPU maps its files by default
    assert staged_enabled(True, cpu, 10) and fits_staged(1 << 60, 1 << 60, cpu)
    assert not staged_enabled(False, cpu, 10)


def _state(lm) -> dict[str, torch.Tensor]:
    out = {n: t for n, t in lm.named_parameters()}
    out.update({n: t for n, t in lm.named_buffers() if t is not None})
    return out


def _assert_same_model(a, b):
    sa, sb = _state(a.model), _state(b.model)
    assert set(sa) == set(sb)
    for name in sa:
        assert sa[name].dtype == sb[name].dtype and torch.equal(sa[name], sb[name]), name


def _assert_no_buffer_views(lm):
    """No parameter or buffer may be a view into a larger storage (a whole file's buffer),
    apart from tied embeddings (the same tensor under two names)."""
    for name, t in _state(lm).items():
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), name


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[5]], ids=lambda c: c[0])
def test_staged_quantized_load_equals_mapped(case, tmp_path):
    hf = tiny_hf_model("LlamaForCausalLM")
    path = _quantized_checkpoint(hf, case, tmp_path / case[0])
    mapped = load_model(str(path), device="cpu", progress=False, staged=False)
    staged = load_model(str(path), device="cpu", progress=False, staged=True)
    _assert_same_model(mapped, staged)
    _assert_no_buffer_views(staged.model)


def test_staged_sharded_tied_load_equals_mapped(tmp_path):
    hf = tiny_hf_model("Qwen2ForCausalLM")  # tied embeddings, biases
    path = save_hf_checkpoint(hf, tmp_path / "m")
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    _shard(path, state)
    mapped = load_model(str(path), device="cpu", progress=False, staged=False)
    staged = load_model(str(path), device="cpu", progress=False, staged=True)
    _assert_same_model(mapped, staged)
    _assert_no_buffer_views(staged.model)
    assert staged.model.lm_head.weight is staged.model.model.embed_tokens.weight


def test_modules_split_across_files_load_staged(tmp_path, monkeypatch):
    """Each quantized module's tensors sit in three files: the loader keeps (cloned) the
    ones waiting for the rest, converts the module when the last arrives, and every file's
    read buffer is gone before the next file is read."""
    import gc

    from edge_llm.model import staged_read

    hf = tiny_hf_model("LlamaForCausalLM")
    path = _quantized_checkpoint(hf, CASES[2], tmp_path / "q")  # GPTQ act-order
    _shard(path, load_file(str(path / "model.safetensors")))  # every third tensor by name
    # weak references to each file buffer's storage (views keep the storage, not the tensor)
    refs: list[int] = []
    original = staged_read.read_file

    def alive() -> list[int]:
        gc.collect()
        return [i for i, ref in enumerate(refs) if not torch.UntypedStorage._expired(ref)]

    def watched(file, device, *args):
        assert not alive(), f"buffers of files {alive()} outlived their file"
        blob, entries = original(file, device, *args)
        refs.append(blob.untyped_storage()._weak_ref())
        return blob, entries

    monkeypatch.setattr(staged_read, "read_file", watched)
    try:
        staged = load_model(str(path), device="cpu", progress=False, staged=True)
        assert len(refs) == 3 and not alive()
    finally:
        for ref in refs:
            torch.UntypedStorage._free_weak_ref(ref)
    mapped = load_model(str(path), device="cpu", progress=False, staged=False)
    _assert_same_model(mapped, staged)
    _assert_no_buffer_views(staged.model)
