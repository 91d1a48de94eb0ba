"""Decode CUDA graphs on a CUDA GPU (``pytest -m gpu``): capture, replay, sleep/wake.

Two random tiny Llama models in fp16, one with plain fp16 linears (cuBLAS inside the graph)
and one in AWQ (the W4A16 Triton kernels inside the graph), both with word-level tokenizers
(no demo model, no network). Checks:

- replay == the same padded forward run eagerly (bit for bit: the same kernels on the same
  inputs), and the decode logits == the unpadded eager step's within fp16 rounding;
- greedy tokens == ``enforce_eager`` for batches of 1, 3, 8 and for mixed traffic, or the first
  difference is at a near-tie of the eager run (the context split of a graph is sized for
  max_model_len, the eager one for the step, so fp32 partial sums round differently);
- sleep (levels 1 and 2) drops the graphs and their memory, wake captures them again, and the
  tokens after waking equal those before; wake restores the W4A16 dequantization buffer
  before it captures;
- the capture is reported (count, seconds, memory); enforce_eager and fp32 capture nothing;
- with gpu_memory_utilization, the KV plan sets the graphs' memory aside, and the allocator's
  peak stays within that fraction of the card;
- async output processing (the default here) gives the tokens of the synchronous engine.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from edge_llm import LLM, SamplingParams  # noqa: E402
from edge_llm.engine.cuda_graphs import is_decode_step  # noqa: E402
from tests.test_cuda_graphs import random_prompts, run_traffic, word_model  # noqa: E402

VOCAB = 1024
MAX_MODEL_LEN = 1024
# nats between the reference's top two tokens at a first difference: one fp16 step of a
# logit between 64 and 128 (the two logits were neighbouring fp16 values): the merged and
# unmerged engines split K differently and can first differ where the reference's top two
# are exactly 0.0625 apart.
NEAR_TIE = 0.0625
SIZES = [1, 2, 4, 8, 16]  # capture_sizes(max_num_seqs=16)


@pytest.fixture(scope="module")
def fp16_dir(tmp_path_factory) -> Path:
    return word_model(tmp_path_factory.mktemp("graphs-fp16"), vocab=VOCAB, logit_scale=20.0,
                      hidden=128, heads=4, kv_heads=2, layers=2, max_pos=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def awq_dir(tmp_path_factory) -> Path:
    from benchmarks.random_checkpoint import SHAPES, make_random_checkpoint

    SHAPES["graphs-tiny"] = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=256,
        intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=MAX_MODEL_LEN,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
    try:
        out = make_random_checkpoint("graphs-tiny", "awq", tmp_path_factory.mktemp("graphs-awq"),
                                     group_size=128, device="cuda")
    finally:
        SHAPES.pop("graphs-tiny")
    _scale_lm_head(out, 20.0)
    return out


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory) -> Path:
    """A tiny Gemma 2 in AWQ: scaled embeddings, soft caps, sliding-window layers, head_dim
    256 (bf16, as the engine runs Gemma)."""
    from benchmarks.random_checkpoint import SHAPES, make_random_checkpoint

    SHAPES["graphs-gemma2"] = dict(
        SHAPES["gemma2-9b"], hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
        max_position_embeddings=MAX_MODEL_LEN, sliding_window=64)
    try:
        return make_random_checkpoint("graphs-gemma2", "awq",
                                      tmp_path_factory.mktemp("graphs-gemma2"),
                                      group_size=128, device="cuda")
    finally:
        SHAPES.pop("graphs-gemma2")


def _scale_lm_head(path: Path, factor: float) -> None:
    """Spread the random checkpoint's logits (std ~0.3 as written) like a trained model's."""
    import json

    from safetensors.torch import load_file, save_file

    shard = path / json.loads((path / "model.safetensors.index.json").read_text())[
        "weight_map"]["lm_head.weight"]
    tensors = load_file(str(shard))
    tensors["lm_head.weight"] = (tensors["lm_head.weight"].float() * factor).half()
    save_file(tensors, str(shard), metadata={"format": "pt"})


@pytest.fixture(params=["fp16", "awq"])
def model_dir(request) -> Path:
    return request.getfixturevalue(f"{request.param}_dir")


def make_llm(path: Path, **kw) -> LLM:
    kw = {"device": "cuda", "dtype": "float16", "max_model_len": MAX_MODEL_LEN,
          "block_size": 16, "max_num_seqs": 16, "max_num_batched_tokens": 512,
          "kv_cache_memory": 1 << 28, "swap_space": 0.0, "enable_prefix_caching": False, **kw}
    return LLM(str(path), **kw)


@pytest.fixture(autouse=True)
def free_device():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def assert_same_or_near_tie(ref: list, got: list, tie: float = NEAR_TIE) -> None:
    """``ref`` / ``got``: CompletionOutputs (ref with logprobs=2). Equal tokens, or the first
    difference at a step where the reference's top two were within NEAR_TIE."""
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        if a.token_ids == b.token_ids:
            continue
        d = next(j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=True))
                 if x != y)
        top = sorted(a.logprobs[d].values(), reverse=True)
        margin = top[0] - top[1]
        assert margin <= tie, f"row {i}: first difference at step {d}, margin {margin:.4f}"


GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=40, logprobs=2)


def test_capture_is_reported(model_dir):
    llm = make_llm(model_dir)
    runner = llm.engine.runner
    assert runner.graphs is not None and sorted(runner.graphs.graphs) == SIZES
    st = llm.engine.stats()
    assert st["num_cuda_graphs"] == len(SIZES)
    assert 0 < st["cuda_graph_capture_seconds"] < 120
    assert st["cuda_graph_memory_bytes"] > 0


def test_gemma2_decode_is_captured_and_equals_eager(gemma2_dir):
    """Everything Gemma 2 adds to a decode step (the embedding scale, soft caps, windows)
    runs inside the graph: captured, replayed, and the greedy tokens are the eager ones."""
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, VOCAB, 5, 150, seed=3)]
    kw = {"dtype": "bfloat16"}
    ref = make_llm(gemma2_dir, enforce_eager=True, **kw).generate(prompts, GREEDY,
                                                                  use_tqdm=False)
    llm = make_llm(gemma2_dir, **kw)
    assert llm.engine.runner.graphs is not None, "decode graph capture failed"
    got = llm.generate(prompts, GREEDY, use_tqdm=False)
    # bf16 logits below the soft cap of 30 are 0.125 apart at most: a tie is within two steps
    assert_same_or_near_tie([o.outputs[0] for o in ref], [o.outputs[0] for o in got], tie=0.25)
    assert llm.engine.runner.graphs.replays[4] >= 30


def test_kv_plan_sets_the_graphs_memory_aside(model_dir):
    """With gpu_memory_utilization, everything the allocator holds after start-up and while
    serving (weights, KV cache, graph pools, activations) stays within that fraction of the
    card, and the graphs hold no more than the plan set aside for them."""
    util = 0.04  # ~5.6 GiB of an H200: a KV cache that is quick to allocate
    total = torch.cuda.get_device_properties(0).total_memory
    llm = make_llm(model_dir, kv_cache_memory=None, gpu_memory_utilization=util,
                   max_num_seqs=256)
    runner = llm.engine.runner
    aside = runner.graph_memory_estimate
    held = runner.graph_stats.memory_bytes + runner.prefill_graph_stats.memory_bytes
    assert runner.graph_stats.sizes[-1] == 256 and runner.prefill_graph_stats.sizes
    assert 0 < held <= aside and runner.plan.graph_bytes == aside
    torch.cuda.reset_peak_memory_stats()
    prompts = [{"prompt_token_ids": p} for p in random_prompts(256, VOCAB, 5, 20, seed=3)]
    llm.generate(prompts, SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=24),
                 use_tqdm=False)
    assert runner.graphs.replays[256] > 0
    assert torch.cuda.max_memory_reserved() <= util * total
    # the engine switched the allocator to expandable segments (engine/kv_cache.py), all
    # but the KV tensors' (plain segments: allocated once, quicker to allocate)
    segments = torch.cuda.memory_snapshot()
    assert any(seg.get("is_expandable") for seg in segments)
    k = runner.kv.layers[0][0].data_ptr()
    kv_seg = next(seg for seg in segments
                  if seg["address"] <= k < seg["address"] + seg["total_size"])
    assert not kv_seg.get("is_expandable")


def test_replay_equals_padded_eager_and_unpadded_logits(model_dir):
    # the scheduler is driven by hand below: steps must finish inside step()
    llm = make_llm(model_dir, disable_async_output_proc=True)
    engine, runner = llm.engine, llm.engine.runner
    for i, p in enumerate(random_prompts(3, VOCAB, 5, 60, seed=11)):
        engine.add_request(str(i), {"prompt_token_ids": p}, GREEDY)
    engine.step()  # the prefill (eager)
    sched = engine.scheduler.schedule()
    assert is_decode_step(sched.scheduled) and len(sched.scheduled) == 3
    with torch.inference_mode():
        ids, pos, meta, _, _ = runner._prepare(sched.scheduled)
        eager = runner.model.compute_logits(runner.model(ids, pos, runner.kv.layers, meta))
    graphs = runner.graphs
    replayed = graphs.run(sched.scheduled).clone()
    captured, graphs.graphs = graphs.graphs, {}  # the same padded forward, run eagerly
    try:
        padded = graphs.run(sched.scheduled).clone()
    finally:
        graphs.graphs = captured
    assert graphs.replays[4] == 2
    assert torch.equal(replayed, padded)
    err = float((replayed - eager).norm() / eager.norm())
    assert err < 1e-2, f"graph logits vs eager step: rel err {err:.2e}"


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_greedy_equals_enforce_eager(model_dir, batch):
    prompts = [{"prompt_token_ids": p} for p in random_prompts(batch, VOCAB, 5, 70, seed=batch)]
    ref = make_llm(model_dir, enforce_eager=True).generate(prompts, GREEDY, use_tqdm=False)
    llm = make_llm(model_dir)
    got = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert_same_or_near_tie([o.outputs[0] for o in ref], [o.outputs[0] for o in got])
    padded = {1: 1, 3: 4, 8: 8}[batch]
    assert llm.engine.runner.graphs.replays[padded] >= 30  # 39 decode steps of the full batch


def test_async_outputs_equal_sync_outputs(model_dir):
    """Async output processing (the GPU default) builds step n's outputs while step n+1
    runs: the same schedule and kernels, so the same tokens, bit for bit."""
    prompts = random_prompts(12, VOCAB, 3, 90, seed=7)
    arrivals = [(3 * i, p) for i, p in enumerate(prompts)]
    sync = make_llm(model_dir, disable_async_output_proc=True)
    assert sync.engine.async_output is False
    ref = run_traffic(sync, arrivals, GREEDY)
    llm = make_llm(model_dir)
    assert llm.engine.async_output is True
    got = run_traffic(llm, arrivals, GREEDY)
    assert {k: v.token_ids for k, v in got.items()} == {k: v.token_ids for k, v in ref.items()}
    assert len(got) == len(prompts)
    llm.engine.check_integrity()


def test_run_ahead_equals_async_outputs_alone(model_dir):
    """Decode run-ahead (the GPU default) launches a decode step before the one before it has
    returned its tokens, feeding them on the device, and adopts it when it is the scheduled
    step: the same batches and kernels as async outputs alone, so the same tokens, bit for
    bit. Sequences cross 16-token blocks (opened ahead) and arrive while others decode."""
    prompts = random_prompts(12, VOCAB, 3, 90, seed=9)
    arrivals = [(3 * i, p) for i, p in enumerate(prompts)]
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=40)  # no logprobs
    plain = make_llm(model_dir, disable_decode_run_ahead=True)
    assert plain.engine.async_output is True and plain.engine.run_ahead is False
    ref = run_traffic(plain, arrivals, params)
    llm = make_llm(model_dir)
    assert llm.engine.run_ahead is True
    got = run_traffic(llm, arrivals, params)
    assert {k: v.token_ids for k, v in got.items()} == {k: v.token_ids for k, v in ref.items()}
    assert len(got) == len(prompts)
    assert llm.engine.ahead_steps["adopted"] >= 20, llm.engine.ahead_steps
    llm.engine.check_integrity()


def test_mixed_traffic_equals_enforce_eager(model_dir):
    """Prompts of 3..90 tokens arriving every few steps: decode steps of varying size hit
    different graphs between eager prefill steps; sequences cross 16-token blocks."""
    prompts = random_prompts(12, VOCAB, 3, 90, seed=5)
    arrivals = [(4 * i, p) for i, p in enumerate(prompts)]
    ref = run_traffic(make_llm(model_dir, enforce_eager=True), arrivals, GREEDY)
    llm = make_llm(model_dir)
    got = run_traffic(llm, arrivals, GREEDY)
    keys = sorted(ref)
    assert keys == sorted(got) and len(keys) == len(prompts)
    assert_same_or_near_tie([ref[k] for k in keys], [got[k] for k in keys])
    replays = llm.engine.runner.graphs.replays
    assert len(replays) >= 3, replays
    llm.engine.check_integrity()


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_drops_graphs_and_wake_captures_again(fp16_dir, level):
    llm = make_llm(fp16_dir)
    engine = llm.engine
    # 12 prompts: decode batches up to 12 need the 16-row graph, which a wake-up defers
    prompts = [{"prompt_token_ids": p} for p in random_prompts(12, VOCAB, 5, 50, seed=7)]
    before = llm.generate(prompts, GREEDY, use_tqdm=False)
    torch.cuda.synchronize()
    held = torch.cuda.memory_reserved()
    graphs = weakref.ref(engine.runner.graphs)
    engine.sleep(level)
    gc.collect()
    assert graphs() is None, "the graphs and their static buffers outlived sleep"
    assert engine.runner.graphs is None and engine.stats()["num_cuda_graphs"] == 0
    assert torch.cuda.memory_reserved() < held
    engine.wake_up()
    assert sorted(engine.runner.graphs.graphs) == [s for s in SIZES if s <= 8]  # the rest lazily
    assert engine.stats()["cuda_graph_memory_bytes"] > 0
    after = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in after] == [o.outputs[0].token_ids for o in before]
    assert 16 in engine.runner.graphs.graphs, "the 16-row graph was not captured on first use"
    assert engine.runner.graphs.replays[16] > 0


def test_wake_restores_the_dequant_buffer_before_capture(awq_dir, monkeypatch):
    """Sleep drops the reused W4A16 dequantization buffer (this engine being its only user);
    wake allocates it again at its size before capturing, so no graph puts dequantized
    weights in its pool."""
    import importlib

    dq = importlib.import_module("edge_llm.kernels.w4a16_dequant")
    for name, fresh in (("_SCRATCH", {}), ("_RETIRED", []), ("_CAPTURED", [False]),
                        ("_USERS", [0])):  # earlier tests' engines keep theirs
        monkeypatch.setattr(dq, name, fresh)
    llm = make_llm(awq_dir)  # the start-up profile (512 rows) dequantizes every weight
    before = {key: buf.numel() for key, buf in dq._SCRATCH.items()}
    assert before
    llm.engine.sleep(1)
    assert not dq._SCRATCH
    llm.engine.wake_up()
    assert {key: buf.numel() for key, buf in dq._SCRATCH.items()} == before
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], GREEDY, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == GREEDY.max_tokens


def test_enforce_eager_and_fp32_capture_nothing(fp16_dir):
    for kw in ({"enforce_eager": True}, {"dtype": "float32"}):
        llm = make_llm(fp16_dir, **kw)
        assert llm.engine.runner.graphs is None, kw
        st = llm.engine.stats()
        assert st["num_cuda_graphs"] == 0 and st["cuda_graph_memory_bytes"] == 0, kw
        out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], GREEDY, use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == GREEDY.max_tokens
        del llm
        gc.collect()
