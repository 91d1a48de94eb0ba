"""benchmarks/serving_host.py and lib/emulated_gpu.py: the real server and engine over an
emulated GPU. Every request gets all its tokens, served and in process; decode steps are
launched ahead as on a GPU; the emulated GPU is busy at most all of the time."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from serving_host import parse_args, run  # noqa: E402


def test_served_and_in_process_levels():
    args = parse_args(["--levels", "1,4", "--requests", "6", "--prompt", "40", "--tokens", "12",
                       "--gpu-ms", "1,0.1,0.01", "--inproc"])
    rows = run(args)
    assert [(r["mode"], r["level"]) for r in rows] == [
        ("served", 1), ("served", 4), ("in process", 1), ("in process", 4)]
    for r in rows:
        assert 0 < r["busy"] <= 1.0 + 1e-6, r
        assert r["tok_s"] > 0 and r["steps"] > 0
        # one prefill launch per request at least (6 requests of 40 tokens, one level each)
        prefill = sum(n for k, n in r["launches"].items() if k.endswith("prefill"))
        assert 1 <= prefill <= 6, r["launches"]
        # 12 tokens each: the rest are decode steps, most launched ahead
        assert r["launches"].get("ahead", 0) >= 6, r["launches"]
        assert r["us_tok"]["engine"] > 0
    served = [r for r in rows if r["mode"] == "served"]
    assert all(r["ttft"] > 0 and r["itl99"] >= r["itl50"] > 0 for r in served)
    assert all(r["us_tok"]["event loop"] > 0 for r in served)
