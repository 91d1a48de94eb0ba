"""benchmarks/kernels_bench.py runs end to end (``--smoke``: tiny shapes, CPU, Triton interpreter),
and ``--plot`` draws the dispatched W4A16 speed-ups of the JSON it wrote."""

from __future__ import annotations

import json
import math

from tests.helpers import run_bench_script


def test_kernels_benchmark_smoke_and_plot(tmp_path):
    proc = run_bench_script("kernels_bench.py", tmp_path, "--smoke")
    assert "==== W4A16 speed-up vs fp16 cuBLAS" in proc.stdout
    res = json.loads((tmp_path / "kernels_bench.json").read_text())
    rows = res["w4a16"]
    assert {r["m"] for r in rows} == {1, 3, 33}
    for r in rows:  # the dispatched path checked against the reference before it is timed
        assert r["auto_res"]["err"] < 1e-4 and math.isfinite(r["auto_res"]["speedup"]), r
    assert max(c["err"] for c in res["w4a16_checks"]) < 1e-4
    png = tmp_path / "speedup.png"
    run_bench_script("kernels_bench.py", tmp_path, "--plot", str(tmp_path / "kernels_bench.json"),
                     str(png), timeout=120)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ceiling_stream_kernel_sums(tmp_path):
    """``kernels_bench.py ceiling --smoke``: the stream kernel it times reads every word of
    its programs' parts, with 0-2 tiles before the wait, and the persistent one every word of
    every phase, the activation words included, with the next chunk read before or after its
    barrier (one program; checked against Python's sums)."""
    proc = run_bench_script("kernels_bench.py", tmp_path, "ceiling", "--smoke", timeout=120)
    assert "stream kernel sums: ok" in proc.stdout
    assert "persistent stream kernel sums (one program): ok" in proc.stdout
