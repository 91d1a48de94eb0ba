"""The end-to-end benchmark tool (benchmarks/e2e.py): its helpers, and a whole smoke run on a
tiny random model (CPU here; on the GPU machine with ``-m gpu``)."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from lib.e2e_common import (  # noqa: E402
    PROFILES,
    Budget,
    PromptMaker,
    decode_bytes_per_step,
    offline_workload,
    percentile,
)
from lib.e2e_report import format_table, headline_rows  # noqa: E402


def test_percentile_interpolates():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)


def test_prompts_are_fresh_and_in_range():
    maker = PromptMaker(50, seed=3)
    a, b = maker.batch(2, 40)
    assert a != b and len(a) == 40
    assert all(3 <= t < 50 for t in a + b)
    assert PromptMaker(50, seed=3).ids(40) == a  # seeded
    with pytest.raises(ValueError):
        PromptMaker(4)


def test_offline_workload_respects_ranges():
    p = PROFILES["smoke"]
    work = offline_workload(p, 1024)
    assert len(work) == p.offline_requests
    assert all(p.offline_prompt[0] <= len(ids) <= p.offline_prompt[1] for ids, _ in work)
    assert all(p.offline_output[0] <= n <= p.offline_output[1] for _, n in work)
    assert offline_workload(p, 1024) == work


def test_budget_refuses_what_does_not_fit():
    assert Budget(None).refusal(1e9) is None
    b = Budget(100.0)
    assert b.refusal(10.0) is None
    assert "needs ~500" in b.refusal(500.0)


class _Arch:
    num_layers, num_kv_heads, head_dim = 2, 2, 4

    @staticmethod
    def layer_window(layer: int) -> None:
        return None  # full attention in every layer


class _LM(torch.nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(100, 8)  # 100*8*4 bytes
        self.lm_head = torch.nn.Linear(8, 100, bias=False)
        if tied:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.norm = torch.nn.Parameter(torch.ones(8))  # 32 bytes
        self.register_buffer("rotary_cos", torch.ones(50, 4))  # left out


def test_decode_bytes_counts_weights_embedding_rows_and_kv():
    untied = decode_bytes_per_step(_LM(False), _Arch, batch=3, mean_context=10, kv_elem_bytes=2)
    assert untied["weights"] == 3 * 8 * 4 + 100 * 8 * 4 + 32  # 3 embedding rows, lm_head
    assert untied["kv"] == 3 * 10 * (2 * 2 * 2 * 4 * 2)
    tied = decode_bytes_per_step(_LM(True), _Arch, batch=3, mean_context=10, kv_elem_bytes=2)
    assert tied["weights"] == 100 * 8 * 4 + 32  # the shared table, read whole by lm_head


def test_offline_floor_counts_kv_positions_and_flops():
    from lib.e2e_floor import linear_weights, offline_floor

    class Llama7B:  # Llama-2-7B's shapes
        hidden_size, intermediate_size, num_layers = 4096, 11008, 32
        num_heads = num_kv_heads = 32
        head_dim, vocab_size = 128, 32000

    class Tiny:  # grouped-query: 4 query heads, 2 K/V heads
        hidden_size, intermediate_size, num_layers = 16, 32, 2
        num_heads, num_kv_heads, head_dim, vocab_size = 4, 2, 4, 100

    assert linear_weights(Llama7B) == 4 * 4096 ** 2 + 3 * 4096 * 11008
    assert linear_weights(Tiny) == 16 * 4 * (2 * 4 + 2 * 2) + 3 * 16 * 32
    # one request, prompt 3, output 4: decode steps attend over 4, 5, 6 positions
    f = offline_floor(Tiny, [(3, 4)], copy_gbs=1.0, tflops=1.0, kv_elem_bytes=2)
    per_position = 2 * Tiny.num_layers * Tiny.num_kv_heads * Tiny.head_dim * 2
    assert f["kv_bytes"] == (4 + 5 + 6) * per_position
    layer = 2 * Tiny.num_layers * linear_weights(Tiny)
    attn = 4 * Tiny.num_layers * Tiny.num_heads * Tiny.head_dim * (1 + 2 + 3)
    assert f["flops"] == (3 + 3) * layer + 4 * 2 * Tiny.hidden_size * Tiny.vocab_size + attn
    assert math.isclose(f["sequential_s"], f["kv_bytes"] / 1e9 + f["flops"] / 1e12)
    assert f["overlapped_s"] == max(f["kv_seconds"], f["matmul_seconds"])
    assert math.isclose(f["sequential_tok_s"], 4 / f["sequential_s"])
    two = offline_floor(Tiny, [(3, 4), (3, 4)], copy_gbs=1.0, tflops=1.0, kv_elem_bytes=1)
    assert two["kv_bytes"] == f["kv_bytes"] and two["flops"] == 2 * f["flops"]
    for bad in ([], [(0, 4)], [(3, 0)]):
        with pytest.raises(ValueError):
            offline_floor(Tiny, bad, 1.0, 1.0, 2)
    with pytest.raises(ValueError):
        offline_floor(Tiny, [(3, 4)], 0.0, 1.0, 2)


def test_headline_table_from_results():
    results = {"shapes": {"s": {
        "decode": {"b1": {"bandwidth_fraction": 0.6, "e2e_tok_s": 300.0}},
        "baseline": {"b1": {"tok_s": 150.0}, "offline": {"best": {"output_tok_s": 10.0}}},
        "offline": {"output_tok_s": 50.0, "floor_fraction": 0.25,
                    "floor": {"sequential_tok_s": 200.0}},
        "formats": {"gptq_vs_awq": 0.9, "gptq-act_vs_awq": 0.95},
    }}}
    rows = {m: (v, ok) for _, m, v, _, ok in headline_rows(results)}
    assert rows["decode b1: fraction of bandwidth floor"] == (0.6, True)
    assert rows["decode b1 tok/s vs transformers b1 static cache"] == (2.0, True)
    assert rows["offline output tok/s vs transformers best static batch"] == (5.0, False)
    assert rows["offline: fraction of the sequential floor (KV reads + matmuls)"] == (0.25, None)
    assert rows["offline: the sequential floor's tok/s vs transformers best static batch"] == (
        20.0, None)
    assert rows["decode b1 gptq / awq"] == (0.9, False)
    assert rows["decode b1 gptq-act / awq"] == (0.95, True)
    text = format_table(headline_rows(results))
    assert "NO" in text and "yes" in text


def _smoke(tmp_path: Path, device: str) -> dict:
    out = tmp_path / "out"
    cmd = [sys.executable, str(BENCH / "e2e.py"), "--smoke", "--device", device,
           "--out", str(out), "--ckpt-dir", str(tmp_path / "ckpt")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    results = out / "e2e.json"
    errors = json.loads(results.read_text())["errors"] if results.is_file() else []
    assert res.returncode == 0, (errors, res.stdout[-3000:] + res.stderr[-3000:])
    assert (out / "e2e.log").stat().st_size > 0
    data = json.loads((out / "e2e.json").read_text())
    assert data["errors"] == [] and data["skipped"] == []
    return data


def _check_smoke(data: dict, out: Path) -> None:
    p = PROFILES["smoke"]
    r = data["shapes"]["tiny-llama"]
    for b in p.decode_batches:
        d = r["decode"][f"b{b}"]
        assert d["decode_tok_s"] > 0 and 0 < d["bandwidth_fraction"]
        # the decode span is a part of its run's wall time (a margin for the two clocks)
        assert 0 < d["step_ms"] * (d["tokens"] - 1) / 1e3 <= d["total_s"] * 1.05 + 0.01
        assert d["bytes_per_step"]["kv"] > 0
    assert r["offline"]["requests"] == p.offline_requests
    assert r["offline"]["output_tokens"] == sum(n for _, n in offline_workload(p, 1024))
    floor = r["offline"]["floor"]
    assert floor["kv_bytes"] > 0 and floor["flops"] > 0 and data["matmul_tflops"] > 0
    assert 0 < r["offline"]["floor_fraction"] == floor["sequential_s"] / r["offline"]["seconds"]
    gen = r["gen64"]
    assert gen["gen_tok_s"] > 0 and gen["prefill_tok_s"] > 0
    gen_s = gen["seqs"] * (gen["tokens"] - 1) / gen["gen_tok_s"]
    assert gen_s <= gen["total_s"] * 1.05 + 0.01  # the decode span lies inside its run
    block_floor = p.prefix_system // 16 * 16
    assert all(c >= block_floor for c in r["prefix"]["cached_tokens_on"])
    # every trial ran forwards, each counted under one path (CPU: eager)
    for side in ("on", "off"):
        steps = r["prefix"][f"forward_steps_{side}"]
        assert sum(steps.values()) >= p.prefix_trials and set(steps) <= {
            "decode_graph", "short_graph", "eager"}, steps
    prefix = r["prefix"]
    if data["meta"]["profile"]["device"] == "cpu":
        assert prefix["graph_replay_ms_on"] is None  # no prefill graphs on the CPU
    else:  # the cached requests replayed one graph, whose forward is a part of their TTFT
        assert 0 < prefix["graph_replay_ms_on"] < statistics.median(prefix["ttft_on_ms"])
    card = r["card24"]
    # the card as the run sized it (on CUDA the smoke's card is larger than the CPU profile's)
    assert card["seqs_fit"] >= 1 and card["weights_plus_kv_bytes"] <= card["card_bytes"]
    assert card["preemptions"] == 0
    assert r["baseline"]["b1"]["tok_s"] > 0
    assert r["baseline"]["offline"]["best"]["batch"] in p.baseline_batches
    f = r["formats"]
    assert set(f) >= {"awq", "awq_before", "gptq", "gptq-act", "awq_after", "gptq_vs_awq",
                      "gptq-act_vs_awq"}
    around = (f["awq_before"]["decode_tok_s"] + f["awq_after"]["decode_tok_s"]) / 2
    assert math.isclose(f["gptq_vs_awq"], f["gptq"]["decode_tok_s"] / around)
    levels = r["serving"]["levels"]
    assert sorted(map(int, levels)) == sorted(p.serve_levels)
    for level, v in levels.items():
        assert v["requests"] == max(int(level), p.serve_min_requests)
        assert v["tokens"] == v["requests"] * p.serve_tokens
        assert v["itl_ms"]["p50"] <= v["itl_ms"]["p99"]
        # forwards of the level by path: at least one a generated token past each request's
        # first (the CPU server has no CUDA graphs, so there all of them eager)
        steps = v["forward_steps"]
        assert set(steps) == {"decode_graph", "short_graph", "eager"}, steps
        assert sum(steps.values()) >= p.serve_tokens - 1
        if data["meta"]["profile"]["device"] == "cpu":
            assert steps["decode_graph"] == steps["short_graph"] == 0
    assert r["serving"]["exit_code"] == 0
    assert any("startup phase ready" in ln for ln in r["serving"]["startup_log"])
    measures = {row["measure"] for row in data["table"]}
    assert "decode b1: fraction of bandwidth floor" in measures
    assert "prefix caching: TTFT off / on" in measures
    if isinstance(data["plots"], str):
        assert "matplotlib" in data["plots"]
        with pytest.raises(ImportError):
            import matplotlib  # noqa: F401
    else:
        assert data["plots"] and all((out / f).stat().st_size > 0 for f in data["plots"])


def test_smoke_run_on_cpu(tmp_path):
    data = _smoke(tmp_path, "cpu")
    _check_smoke(data, tmp_path / "out")


@pytest.mark.gpu
def test_smoke_run_on_gpu(tmp_path):
    data = _smoke(tmp_path, "cuda")
    _check_smoke(data, tmp_path / "out")
    card = data["shapes"]["tiny-llama"]["card24"]
    assert card["peak_reserved_bytes"] > 0 and card["peak_plus_context_ok"]
    assert 0 < card["graph_bytes"] <= card["graph_estimate_bytes"]


def test_prefill_flops_count_new_tokens_attention_and_one_head_row():
    from lib.e2e_floor import layer_shapes, linear_weights, prefill_flops
    from random_checkpoint import SHAPES

    class Llama31_8B:  # Llama-3.1-8B: GQA 8, 128k vocabulary
        hidden_size, intermediate_size, num_layers = 4096, 14336, 32
        num_heads, num_kv_heads, head_dim, vocab_size = 32, 8, 128, 128256

    cfg = SHAPES["llama3.1-8b"]
    assert (cfg["num_attention_heads"] // cfg["num_key_value_heads"], cfg["vocab_size"],
            cfg["rope_scaling"]["rope_type"]) == (4, 128256, "llama3")
    assert layer_shapes(Llama31_8B) == [(4096, 6144), (4096, 4096), (4096, 28672),
                                         (14336, 4096)]
    assert sum(k * n for k, n in layer_shapes(Llama31_8B)) == linear_weights(Llama31_8B)
    a = Llama31_8B
    attn = 4 * a.num_layers * a.num_heads * a.head_dim
    head = 2 * a.hidden_size * a.vocab_size
    assert prefill_flops(a, 10) == 10 * 2 * a.num_layers * linear_weights(a) + attn * 55 + head
    # 4 cached of 10: tokens 5..10 run, attending over 5..10 positions each
    assert prefill_flops(a, 10, cached=4) == (6 * 2 * a.num_layers * linear_weights(a)
                                              + attn * (55 - 10) + head)
    for bad in ((10, 10), (10, -1), (0, 0)):
        with pytest.raises(ValueError):
            prefill_flops(a, *bad)


def _long_smoke(tmp_path: Path, device: str) -> None:
    """``--scenarios long`` on the tiny GQA llama3-rope shape: every context of the profile,
    both KV dtypes, fields present and sane, and the headline rows; then one KV dtype and
    one context."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(BENCH / "e2e.py"), "--smoke", "--device", device,
           "--scenarios", "long", "--out", str(out), "--ckpt-dir", str(tmp_path / "ckpt")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    results = out / "e2e.json"
    errors = json.loads(results.read_text())["errors"] if results.is_file() else []
    assert res.returncode == 0, (errors, res.stdout[-3000:] + res.stderr[-3000:])
    data = json.loads((out / "e2e.json").read_text())
    assert data["errors"] == [] and data["skipped"] == []
    p = PROFILES["smoke"]
    assert set(data["shapes"]) == {p.long_shape}  # the long phase alone ran
    long = data["shapes"][p.long_shape]["long"]
    assert long["matmul_tflops"] > 0 and long["prefill_chunk"] == min(
        p.long_batched_tokens, max(p.long_contexts))
    assert set(long["kv"]) == set(p.long_kv_dtypes) == {"auto", "fp8"}
    for kv in long["kv"].values():
        assert kv["load_s"] > 0
        for n in p.long_contexts:
            c = kv[f"c{n}"]
            assert c["context"] == n and c["cached_tokens"] >= n - 16
            for key in ("ttft_whole_s", "ttft_cached_s", "prefill_tok_s", "decode_step_ms",
                        "decode_tok_s", "decode_floor_ms", "ttft_whole_over_cached"):
                assert c[key] > 0, (key, c)
            for key in ("prefill_fraction", "decode_floor_fraction"):
                assert 0 < c[key] <= 1.5, (key, c)
            assert c["decode_bytes_per_step"]["kv"] > 0
    fp8, fp16 = long["kv"]["fp8"], long["kv"]["auto"]
    n = max(p.long_contexts)
    assert fp8[f"c{n}"]["decode_bytes_per_step"]["kv"] * 2 == pytest.approx(
        fp16[f"c{n}"]["decode_bytes_per_step"]["kv"])
    measures = {row["measure"] for row in data["table"]}
    assert f"long {n} fp8 KV: decode b1 fraction of floor (weights + KV)" in measures
    one = subprocess.run(cmd[:-4] + ["--kv-cache-dtype", "fp8", "--long-contexts", "64",
                                     "--out", str(tmp_path / "one"),
                                     "--ckpt-dir", str(tmp_path / "ckpt")],
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    only = json.loads((tmp_path / "one" / "e2e.json").read_text())
    assert set(only["shapes"][p.long_shape]["long"]["kv"]) == {"fp8"}
    assert list(only["shapes"][p.long_shape]["long"]["kv"]["fp8"]) == ["load_s", "c64"]


def test_long_prompts_smoke_on_cpu(tmp_path):
    _long_smoke(tmp_path, "cpu")


@pytest.mark.gpu
def test_long_prompts_smoke_on_gpu(tmp_path):
    _long_smoke(tmp_path, "cuda")


def test_prefix_trials_option(tmp_path: Path):
    from e2e import parse_args

    assert parse_args(["--out", str(tmp_path), "--prefix-trials", "20"]).prefix_trials == 20
    assert parse_args(["--out", str(tmp_path)]).prefix_trials is None
    for bad in ("0", "-3", "x"):
        with pytest.raises(SystemExit):
            parse_args(["--out", str(tmp_path), "--prefix-trials", bad])


@pytest.mark.parametrize("flag", ["--baseline-batches", "--decode-batches", "--long-contexts"])
def test_batch_list_options(tmp_path: Path, flag: str):
    from e2e import parse_args

    attr = flag[2:].replace("-", "_")
    assert getattr(parse_args(["--out", str(tmp_path), flag, "64,128"]), attr) == (64, 128)
    assert getattr(parse_args(["--out", str(tmp_path)]), attr) is None
    for bad in ("0", "a,4", ""):
        with pytest.raises(SystemExit):
            parse_args(["--out", str(tmp_path), flag, bad])
