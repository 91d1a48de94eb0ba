"""benchmarks/scheduler_sim.py: the scheduler alone on the offline workload, by growth
reserve (the figures BENCHMARKS.md quotes come from this function)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from scheduler_sim import simulate  # noqa: E402


def test_growth_reserve_removes_preemptions_of_the_offline_workload():
    none = simulate("offline", 2176, 0)
    held = simulate("offline", 2176, 128)
    assert none["preemptions"] > 50 and none["fed_ratio"] > 1.05  # recomputed tokens
    assert held["preemptions"] == 0 and held["fed_ratio"] == 1.0
    assert held["decode_rows_mean"] < none["decode_rows_mean"]  # the price: fewer rows
