"""benchmarks/quality.py runs both parts end to end (``--smoke``: a tiny random model with the
demo's tokenizer, CPU) and writes rows whose figures are sane."""

from __future__ import annotations

import json
import math

from tests.helpers import run_bench_script


def test_weights_smoke(tmp_path):
    proc = run_bench_script("quality.py", tmp_path, "weights", "--smoke", timeout=300)
    rows = json.loads((tmp_path / "quality_weights.json").read_text())
    assert [r["config"] for r in rows] == ["fp32", "rtn-g32"]
    for r in rows:
        assert set(r["ppl"]) == {"eval", "heldout"}
        assert all(math.isfinite(v) and v > 1 for v in r["ppl"].values()), r
    # the AWQ checkpoint scored again through edge-llm's loader agrees with transformers
    rtn = rows[1]
    for text, ppl in rtn["ppl_edge_llm"].items():
        assert math.isclose(ppl, rtn["ppl"][text], rel_tol=1e-2), (text, ppl, rtn["ppl"])
    assert "rtn-g32" in proc.stdout


def test_kv_cache_smoke(tmp_path):
    run_bench_script("quality.py", tmp_path, "kv-cache", "--smoke", timeout=300)
    rows = json.loads((tmp_path / "quality_kv_cache.json").read_text())
    assert set(rows) == {"fp32 (auto)", "fp8 e4m3"}
    assert rows["fp32 (auto)"]["ppl_ratio"] == {"eval": 1.0, "heldout": 1.0}
    assert rows["fp32 (auto)"]["greedy_equal"] == [4] * 5
    for ratio in rows["fp8 e4m3"]["ppl_ratio"].values():
        assert 0.9 < ratio < 1.1
    assert all(0 <= n <= 4 for n in rows["fp8 e4m3"]["greedy_equal"])
