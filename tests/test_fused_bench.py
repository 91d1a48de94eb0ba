"""benchmarks/fused.py runs end to end (``--smoke``: tiny shapes, CPU, Triton interpreter)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fused.py"


def test_fused_benchmark_smoke(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
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
