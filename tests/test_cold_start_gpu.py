"""benchmarks/cold_start_gpu.py on the tiny random model: the engine-subprocess start and the
server start on CPU; the GPU run (pinned buffers, page-cache drop) with ``-m gpu``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "out"
    cmd = [sys.executable, str(BENCH / "cold_start_gpu.py"), "--shape", "tiny-llama",
           "--out", str(out), "--ckpt-dir", str(tmp_path / "ckpt"), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "cold start (tiny-llama" in (out / "cold_start.log").read_text()
    data = json.loads((out / "cold_start.json").read_text())
    assert data["errors"] == []
    return data["shapes"]["tiny-llama"]


def _check_start(r: dict, plain_gb_s: float) -> None:
    assert 0 < r["phases"]["weight_load"] < r["ready"] <= r["first_token"]
    assert r["load_fraction"] == pytest.approx(r["load_gb_s"] / plain_gb_s)
    assert r["wake_s"] > 0 and r["first_token_after_wake_s"] > 0
    assert r["exit_code"] == 0


def test_engine_subprocess_starts_on_cpu(tmp_path):
    d = _run(tmp_path, "--device", "cpu", "--engine-only", "--starts", "2", "--profile")
    assert d["mode"].startswith("engine subprocess")
    assert d["drop_caches"] == {"ok": False, "detail": "not asked"}
    warm = d["plain_read"]["warm"]
    assert warm["bytes"] == d["checkpoint_bytes"] > 0 and not warm["pinned"]
    for key, cache in (("start1", "empty"), ("start2", "reused")):
        assert d[key]["compile_cache"] == cache
        _check_start(d[key], warm["gb_s"])
        # the engine's phases, no CUDA ones on a CPU; the construction's profile
        assert d[key]["phases"]["kernel_warmup"] == 0 and "cuda_context" not in d[key]["phases"]
        assert d[key]["prep"]["skipped"] == "not a CUDA device"  # serve's prep, no-op here
    assert "llm_engine.py" in (tmp_path / "out" / "profile1.txt").read_text()
    assert d["phase_table"][0].split(" | ")[0:3] == ["start", "import", "weight_load"]
    assert len(d["phase_table"]) == 3  # a header and two starts


def test_server_start_on_cpu(tmp_path):
    d = _run(tmp_path, "--device", "cpu", "--starts", "1", "--bake")
    assert d["mode"] == "server"
    # the caches came from `edge-llm warmup` (nothing to compile on a CPU)
    assert d["bake"]["exit_code"] == 0 and "0 Triton cache files" in d["bake"]["summary"]
    r = d["start1"]
    assert r["compile_cache"] == "baked"
    _check_start(r, d["plain_read"]["warm"]["gb_s"])
    assert r["health_asleep"] == 503 and r["port_open"] <= r["ready"]
    assert set(r["phases"]) >= {"import", "weight_load", "kv_allocation", "ready"}


@pytest.mark.gpu
def test_starts_on_gpu(tmp_path):
    d = _run(tmp_path, "--device", "cuda", "--starts", "2")
    reads = d["plain_read"]
    assert reads["warm"]["pinned"]
    if d["drop_caches"]["ok"]:
        _check_start(d["start1"], reads["cold"]["gb_s"])
        assert d["start1"]["page_cache"] == "cold"
    _check_start(d["start2"], reads["warm"]["gb_s"])
