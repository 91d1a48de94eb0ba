"""Checkpoint discovery and validation: sharded files, corrupt files, hub ids offline."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from edge_llm.model.loader import load_model
from edge_llm.model.weights import CorruptCheckpointError, ModelNotFoundError
from tests.helpers import rel_err, save_hf_checkpoint, tiny_hf_model
from tests.test_model_parity import run_prefill_then_decode


def _shard(path, state):
    """Split a checkpoint into three shards with an index, as save_pretrained does."""
    (path / "model.safetensors").unlink()
    names = sorted(state)
    weight_map = {}
    for i in range(3):
        part = {k: state[k].contiguous() for k in names[i::3]}
        fname = f"model-{i + 1:05d}-of-00003.safetensors"
        save_file(part, str(path / fname))
        weight_map.update({k: fname for k in part})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )


def test_sharded_checkpoint_loads(tmp_path):
    hf = tiny_hf_model("LlamaForCausalLM")
    path = save_hf_checkpoint(hf, tmp_path / "m")
    _shard(path, hf.state_dict())
    loaded = load_model(str(path), device="cpu", progress=False)
    ids = torch.randint(0, 160, (10,))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert rel_err(run_prefill_then_decode(loaded.model, ids), ref) < 1e-4
    assert loaded.num_bytes > 0 and loaded.load_seconds > 0


def test_truncated_file_is_refused_by_name(tmp_path):
    hf = tiny_hf_model("LlamaForCausalLM")
    path = save_hf_checkpoint(hf, tmp_path / "m")
    _shard(path, hf.state_dict())
    shard = path / "model-00002-of-00003.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(CorruptCheckpointError, match="model-00002-of-00003"):
        load_model(str(path), device="cpu", progress=False)


def test_garbage_header_is_refused(tmp_path):
    hf = tiny_hf_model("LlamaForCausalLM")
    path = save_hf_checkpoint(hf, tmp_path / "m")
    (path / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(CorruptCheckpointError, match="model.safetensors"):
        load_model(str(path), device="cpu", progress=False)


def test_missing_tensor_is_named(tmp_path):
    hf = tiny_hf_model("LlamaForCausalLM")
    state = dict(hf.state_dict())
    del state["model.layers.1.mlp.up_proj.weight"]
    path = save_hf_checkpoint(hf, tmp_path / "m", state=state)
    with pytest.raises(ValueError, match="up_proj"):
        load_model(str(path), device="cpu", progress=False)


def test_hub_id_offline_gives_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelNotFoundError) as err:
        load_model("someone/not-a-cached-model", device="cpu", progress=False)
    msg = str(err.value)
    assert "someone/not-a-cached-model" in msg and "local folder" in msg


def test_folder_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_model(str(tmp_path / "empty"), device="cpu", progress=False)


def test_bf16_needs_sm80(monkeypatch, caplog):
    """dtype resolution on a GPU without bf16 (the T4's sm_75; capability stubbed, a unit
    test): "auto" on a bf16 checkpoint takes fp16 with a warning, an explicit bfloat16 is
    refused in one line; sm_80 keeps bf16; 4-bit checkpoints run fp16 (Gemma's bf16 where
    the GPU has it), the CPU fp32."""
    from types import SimpleNamespace

    from edge_llm.model.loader import resolve_dtype

    cap = [(7, 5)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap[0])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    gpu = torch.device("cuda", 0)
    bf16 = SimpleNamespace(torch_dtype="bfloat16", prefers_bf16=False)
    gemma = SimpleNamespace(torch_dtype="bfloat16", prefers_bf16=True, architecture="Gemma")
    with caplog.at_level("WARNING"):
        assert resolve_dtype("auto", bf16, False, gpu) == torch.float16
    assert "no bfloat16 support" in caplog.text
    with pytest.raises(ValueError, match="capability 8.0 or later; Tesla T4 has 7.5"):
        resolve_dtype("bfloat16", bf16, False, gpu)
    assert resolve_dtype("float16", bf16, False, gpu) == torch.float16
    assert resolve_dtype("auto", bf16, True, gpu) == torch.float16
    with caplog.at_level("WARNING"):  # Gemma (bf16 preferred) on a T4: fp16, said
        assert resolve_dtype("auto", gemma, True, gpu) == torch.float16
    assert "overflow float16" in caplog.text
    cap[0] = (8, 0)
    assert resolve_dtype("auto", bf16, False, gpu) == torch.bfloat16
    assert resolve_dtype("auto", bf16, True, gpu) == torch.float16  # 4-bit: fp16
    assert resolve_dtype("auto", gemma, True, gpu) == torch.bfloat16  # 4-bit Gemma: bf16
    assert resolve_dtype("bfloat16", bf16, False, gpu) == torch.bfloat16
    assert resolve_dtype("auto", bf16, False, torch.device("cpu")) == torch.float32
