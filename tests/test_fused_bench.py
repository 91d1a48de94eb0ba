"""``benchmarks/kernels_bench.py fused`` runs end to end (``--smoke``: tiny shapes, CPU, Triton
interpreter)."""

from __future__ import annotations

import json
import math

from tests.helpers import run_bench_script


def test_fused_benchmark_smoke(tmp_path):
    proc = run_bench_script("kernels_bench.py", tmp_path, "fused", "--smoke")
    assert "==== fused kernels vs the torch ops they replace" in proc.stdout
    rows = json.loads((tmp_path / "fused_bench.json").read_text())["rows"]
    assert {(r["rows"], r["op"]) for r in rows} == {
        (n, op) for n in (1, 5)
        for op in ("rms_norm", "add_rms_norm", "rotary", "silu_and_mul", "layer")}
    for r in rows:
        assert r["bytes"] > 0 and math.isfinite(r["speedup"]) and r["speedup"] > 0, r
    layer = next(r for r in rows if r["op"] == "layer" and r["rows"] == 5)
    parts = {r["op"]: r for r in rows if r["rows"] == 5}
    want = 2 * parts["add_rms_norm"]["fused_us"] + parts["rotary"]["fused_us"] \
        + parts["silu_and_mul"]["fused_us"]
    assert math.isclose(layer["fused_us"], want)
