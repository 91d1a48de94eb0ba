"""The CPU benchmark scripts without a test of their own run end to end at small sizes and
print their table: scheduler_step.py (no model) and structured_outputs.py (the demo)."""

from __future__ import annotations

import re

from tests.helpers import run_bench_script


def test_scheduler_step_small(tmp_path):
    proc = run_bench_script("scheduler_step.py", tmp_path, "--seqs", "8", "--prompt", "40",
                            "--steps", "20", timeout=120)
    assert re.search(r"\d+\.\d+", proc.stdout), proc.stdout


def test_structured_outputs_small(tmp_path):
    proc = run_bench_script("structured_outputs.py", tmp_path, "--batch", "2",
                            "--constrained", "1", "--tokens", "6", "--tools", "2",
                            "--compiles", "2", timeout=300)
    row = proc.stdout.strip().splitlines()[-1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:2] == ["2", "1"], row
    free, mixed, ratio = map(float, cells[2:5])
    # the table prints the rates to 0.1 and the ratio to 0.001: the ratio of the printed rates
    # is off the printed ratio by at most what their rounding (0.05 each) moves it, plus the
    # ratio's own rounding (0.0005)
    slack = 0.05 * (free + mixed) / (free * (free - 0.05)) + 5e-4 + 1e-9
    assert free > 0 and mixed > 0 and abs(ratio - mixed / free) <= slack, (row, slack)
