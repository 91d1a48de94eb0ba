"""The start-up memory probes kept on disk (edge_llm/engine/probe_cache.py): measured once per
key, reused by the next start with the same key, measured again when any part of the key,
the stored file or the switch says so; and the runner's use of it
(``startup_probes.memory_probes``, with the two probes counted: they only run on CUDA, so the
GPU is faked here). The probes themselves are measured on the GPU (tests/test_warmup_gpu.py,
benchmarks/cold_start.py)."""

from __future__ import annotations

import json
import logging
import os
import types

import pytest

from edge_llm import envs
from edge_llm.engine import probe_cache as pc
from edge_llm.engine.runner import ModelRunner

PARTS = {"arch": {"hidden": 4096}, "scheduler": {"max_num_batched_tokens": 8192},
         "versions": ["2.11", "3.6"], "env": {}}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_LLM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(envs.PROBE_CACHE.name, raising=False)
    return tmp_path / "cache"


class Measure:
    def __init__(self, peak=7 << 30, graphs=156 << 20):
        self.calls, self.values = 0, {"peak_bytes": peak, "graph_bytes": graphs}

    def __call__(self):
        self.calls += 1
        return dict(self.values)


def test_measured_once_then_reused(cache_dir):
    m = Measure()
    assert pc.cached_probes(PARTS, m) == (m.values, False)
    files = list((cache_dir / "probes").glob("*.json"))
    assert len(files) == 1
    stored = json.loads(files[0].read_text())
    assert stored["peak_bytes"] == 7 << 30 and stored["parts"]["arch"] == {"hidden": 4096}
    m2 = Measure(peak=1, graphs=1)
    assert pc.cached_probes(dict(PARTS), m2) == (m.values, True)
    assert m2.calls == 0
    assert not list((cache_dir / "probes").glob(".*.tmp"))


@pytest.mark.parametrize("change", [
    {"arch": {"hidden": 5120}},
    {"scheduler": {"max_num_batched_tokens": 4096}},
    {"versions": ["2.11", "3.7"]},
    {"env": {"EDGE_LLM_KERNELS": "torch"}},
    {"gpu": ["NVIDIA GeForce RTX 4090", 24 << 30, 8, 9]},
])
def test_any_part_changed_measures_again(change):
    pc.cached_probes(PARTS, Measure())
    m = Measure(peak=3 << 30)
    assert pc.cached_probes({**PARTS, **change}, m) == (m.values, False)
    assert m.calls == 1
    assert pc.cached_probes({**PARTS, **change}, Measure())[1]  # stored under its own key
    assert pc.cached_probes(PARTS, Measure())[0]["peak_bytes"] == 7 << 30


def test_switch_off_measures_every_time_and_stores_nothing(cache_dir, monkeypatch):
    monkeypatch.setenv(envs.PROBE_CACHE.name, "0")
    m = Measure()
    for _ in range(2):
        assert pc.cached_probes(PARTS, m) == (m.values, False)
    assert m.calls == 2 and not (cache_dir / "probes").exists()
    monkeypatch.setenv(envs.PROBE_CACHE.name, "yes")
    with pytest.raises(ValueError, match="EDGE_LLM_PROBE_CACHE must be 0 or 1, got 'yes'"):
        pc.cached_probes(PARTS, m)


@pytest.mark.parametrize("content", [
    "{not json", "[]", '{"key": "other", "peak_bytes": 1, "graph_bytes": 1}',
    '{"key": "KEY", "peak_bytes": 1}', '{"key": "KEY", "peak_bytes": -1, "graph_bytes": 1}',
    '{"key": "KEY", "peak_bytes": true, "graph_bytes": 1}',
    '{"key": "KEY", "peak_bytes": 1.5, "graph_bytes": 1}',
])
def test_a_bad_file_is_measured_again_and_replaced(cache_dir, content):
    key = pc.probe_key(PARTS)
    (cache_dir / "probes").mkdir(parents=True)
    path = cache_dir / "probes" / f"{key}.json"
    path.write_text(content.replace("KEY", key))
    assert pc.load(key) is None
    m = Measure()
    assert pc.cached_probes(PARTS, m) == (m.values, False)
    assert pc.load(key) == m.values


def test_an_unwritable_folder_still_gives_the_measurement(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the folder should be
    m = Measure()
    assert pc.cached_probes(PARTS, m, folder=blocker / "probes") == (m.values, False)
    assert pc.save("k", m.values, PARTS, folder=blocker / "probes") is None


def test_environment_and_source_digest(monkeypatch):
    env = {"EDGE_LLM_KERNELS": "torch", "EDGE_LLM_PORT": "9000", "EDGE_LLM_CACHE_DIR": "/c",
           "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "HOME": "/root",
           "EDGE_LLM_PROBE_CACHE": "1", "EDGE_LLM_MAX_NUM_SEQS": "64"}
    assert pc.probe_environment(env) == {
        "EDGE_LLM_KERNELS": "torch", "EDGE_LLM_MAX_NUM_SEQS": "64",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    digest = pc.source_digest()
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert pc.probe_key(PARTS) == pc.probe_key(json.loads(json.dumps(PARTS)))
    assert pc.probe_key(PARTS) != pc.probe_key({**PARTS, "x": 1})


def _fake_cuda_runner(kv_cache_memory=None):
    """A runner with only what ``_memory_probes`` reads, on a pretend CUDA device, whose two
    probes count their calls."""
    runner = ModelRunner.__new__(ModelRunner)
    runner.device = types.SimpleNamespace(type="cuda")
    runner.cache_config = types.SimpleNamespace(kv_cache_memory=kv_cache_memory,
                                                num_gpu_blocks_override=None)
    runner.calls = []
    runner.measure_peak_memory = lambda: runner.calls.append("peak") or 5 << 30
    runner.measure_graph_memory = lambda: runner.calls.append("graphs") or 100 << 20
    return runner


@pytest.fixture
def fake_parts(monkeypatch):
    import edge_llm.engine.startup_probes as sp

    monkeypatch.setattr(sp, "probe_parts", lambda runner, sized: {**PARTS, "sized": sized})


def test_runner_reuses_its_probes_on_the_next_start(caplog, fake_parts):
    first = _fake_cuda_runner()
    assert first._memory_probes() == {"peak_bytes": 5 << 30, "graph_bytes": 100 << 20}
    assert first.calls == ["peak", "graphs"]
    second = _fake_cuda_runner()
    with caplog.at_level(logging.INFO, logger="edge_llm.engine.startup_probes"):
        assert second._memory_probes() == {"peak_bytes": 5 << 30, "graph_bytes": 100 << 20}
    assert second.calls == [] and second.probes_reused and not first.probes_reused
    assert "Memory probes: 5.00 GiB peak, 100 MiB of CUDA graphs, as measured by an " \
        "earlier start" in caplog.text
    explicit = _fake_cuda_runner(kv_cache_memory=1 << 30)  # the KV size given: no graph probe
    assert explicit._memory_probes() == {"peak_bytes": 5 << 30, "graph_bytes": 0}
    assert explicit.calls == ["peak"]


def test_runner_on_cpu_measures_and_stores_nothing(cache_dir):
    runner = _fake_cuda_runner()
    runner.device = types.SimpleNamespace(type="cpu")
    runner._memory_probes()  # probe_parts is not asked for: CUDA properties do not exist here
    assert runner.calls == ["peak", "graphs"] and not (cache_dir / "probes").exists()
    assert os.environ["EDGE_LLM_CACHE_DIR"] == str(cache_dir)


def test_a_real_runners_key_parts_serialise_and_track_the_settings(tmp_path, monkeypatch):
    """``startup_probes.probe_parts`` of a real (CPU) runner, with the CUDA queries it makes
    answered here: every part serialises, and a different scheduler setting, environment
    switch or GPU gives a different key."""
    import torch

    from edge_llm import LLM
    from tests.test_cuda_graphs import word_model

    path = word_model(tmp_path / "m")
    kw = dict(device="cpu", dtype="float32", max_model_len=128, max_num_seqs=4,
              max_num_batched_tokens=64, swap_space=0.0, kv_cache_memory=1 << 20)
    runners = [LLM(str(path), **kw).engine.runner,
               LLM(str(path), **{**kw, "max_num_batched_tokens": 128}).engine.runner]
    gpu = types.SimpleNamespace(name="NVIDIA GeForce RTX 4090", total_memory=24 << 30,
                                major=8, minor=9)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: gpu)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 123 << 20)
    from edge_llm.engine.startup_probes import probe_parts

    parts = [probe_parts(r, sized=True) for r in runners]
    keys = [pc.probe_key(p) for p in parts]
    assert json.loads(json.dumps(parts[0], default=str))["gpu"][0] == gpu.name
    assert parts[0]["scheduler"]["max_num_batched_tokens"] == 64
    assert keys[0] != keys[1]
    assert pc.probe_key(probe_parts(runners[0], sized=True)) == keys[0]  # stable
    monkeypatch.setenv("EDGE_LLM_KERNELS", "torch")
    assert pc.probe_key(probe_parts(runners[0], sized=True)) != keys[0]
    monkeypatch.delenv("EDGE_LLM_KERNELS")
    gpu.total_memory = 80 << 30
    assert pc.probe_key(probe_parts(runners[0], sized=True)) != keys[0]


def test_kernel_warm_up_adds_a_two_sequence_prefill(tmp_path, monkeypatch):
    """The kernel warm-up (startup_probes.py) runs its forwards on the CPU here, with CUDA's
    guard and device arguments answered: the single-sequence prefills up to the limit, then
    34 tokens as two sequences of 17 (the several-sequence attention variants that the
    whole-step probe, skipped on a probe-cache hit, used to load first), again as if over a
    long context (the split-key prefill variant); none above it."""
    import torch

    import edge_llm.engine.startup_probes as sp
    from edge_llm import LLM
    from tests.test_cuda_graphs import word_model

    llm = LLM(str(word_model(tmp_path / "m")), device="cpu", dtype="float32",
              max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64, swap_space=0.0,
              kv_cache_memory=1 << 20)
    runner = llm.engine.runner
    calls, seqs = [], []
    real_prefill, real_arange, real_zeros = sp.scratch_prefill, torch.arange, torch.zeros

    def prefill(model, t, bs, dtype, device, max_seq_len=None, num_layers=None):
        calls.append((t, max_seq_len))
        kv, meta = real_prefill(model, t, bs, dtype, torch.device("cpu"), max_seq_len,
                                num_layers)
        seqs.append(meta.seq_lens.tolist())
        kv_dtypes.add(dtype)
        assert len(kv) == (num_layers or len(runner.model.model.layers))
        return kv, meta

    layer_calls = [0] * len(runner.model.model.layers)
    for i, layer in enumerate(runner.model.model.layers):
        def count(*a, i=i, forward=layer.forward, **k):
            layer_calls[i] += 1
            return forward(*a, **k)
        layer.forward = count
    kv_dtypes = set()

    monkeypatch.setattr(sp, "scratch_prefill", prefill)
    monkeypatch.setattr(sp, "triton_enabled", lambda device, dtype: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch, "arange", lambda *a, device=None, **k: real_arange(*a, **k))
    monkeypatch.setattr(torch, "zeros", lambda *a, device=None, **k: real_zeros(*a, **k))
    cuda = types.SimpleNamespace(type="cuda")
    hints = []
    model_forward = runner.model.forward

    def forward(ids, positions, kv, meta):
        hints.append(meta.max_seq_len)
        return model_forward(ids, positions, kv, meta)

    monkeypatch.setattr(runner.model, "forward", forward)
    sp.warm_up_kernels(runner.model, runner.block_size, torch.float32, cuda, 64)
    assert calls == [(t, t) for t in (1, 2, 3, 4, 5, 17, 33)] + [(34, 17), (4, 2), (34, 17)]
    assert seqs[-3:] == [[17, 17], [2, 2], [17, 17]]
    # the last two plan their attention for a long context: the split-key prefill variants
    # (a forward of 4 tokens launches with PDL on Hopper, one of 34 without)
    split = sp.WARMUP_SPLIT_CONTEXT
    assert hints == [1, 2, 3, 4, 5, 17, 33, 17, split, split], hints
    assert layer_calls[0] == len(calls) and not any(layer_calls[1:]), layer_calls
    assert runner.model.num_active_layers is None  # the whole model again afterwards
    calls.clear()
    sp.warm_up_kernels(runner.model, runner.block_size, torch.float32, cuda, 20,
                       kv_dtype=torch.uint8)
    assert calls == [(t, t) for t in (1, 2, 3, 4, 5, 17)] + [(4, 2)]
    assert kv_dtypes == {torch.float32, torch.uint8}  # an fp8 cache's kernels warmed too
