"""benchmarks/host_overhead.py on the demo model: every part of a decode step is timed on
steps of exactly the requested rows, and the engine is left idle (the stand-in for the
model is removed again)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from host_overhead import measure  # noqa: E402

from edge_llm import LLM  # noqa: E402
from tests.engine_fixtures import demo_dir  # noqa: E402, F401


def test_parts_of_a_decode_step(demo_dir):  # noqa: F811
    llm = LLM(str(demo_dir), max_model_len=128, enforce_eager=True, growth_reserve=0,
              enable_prefix_caching=False)
    real = llm.engine.runner.execute
    for final_only in (False, True):
        parts = measure(llm, 6, 40, 3, final_only)
        assert set(parts) == {"schedule", "inputs", "sample", "update", "outputs"}
        assert all(v > 0 for v in parts.values())
    assert llm.engine.runner.execute == real
    assert not llm.engine.has_unfinished()
    st = llm.engine.stats()
    assert st["num_free_blocks"] == st["num_total_blocks"]
