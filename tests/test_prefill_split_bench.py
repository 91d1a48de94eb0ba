"""benchmarks/prefill_split.py runs end to end (``--smoke``: tiny shapes, CPU, Triton
interpreter): every variant is checked against the reference, then timed, one table row."""

from __future__ import annotations

import re

from tests.helpers import run_bench_script


def test_prefill_split_benchmark_smoke(tmp_path):
    proc = run_bench_script("prefill_split.py", tmp_path, "--smoke", "--variants")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("| ")]
    header, rows = lines[0], lines[2:]  # after the separator
    assert "one partition" in header and "dispatched, 3 stages" in header
    assert len(rows) == 1 and rows[0].startswith("| llama2 4/4 | 3 | 100 | 1 |"), rows
    cells = re.findall(r"([\d.]+) \(([\d.]+)x, ([\d.]+)\)", rows[0])
    assert len(cells) == 7 and cells[0][1] == "1.00", cells
    assert all(float(us) > 0 for us, _, _ in cells)
