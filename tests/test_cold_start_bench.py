"""benchmarks/cold_start.py on the tiny random model: the engine-subprocess start (with its
phase table and profile, with and without the device preparation) and the server start from
the caches `edge-llm warmup` bakes, on CPU; the GPU run (pinned buffers, page-cache drop) with
``-m gpu``; a model folder given by path; flags that do not go together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
# the servers, `edge-llm warmup` and the engine workers import this checkout's edge_llm (they run
# outside it, where an installed edge_llm would be found otherwise)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def _run(tmp_path: Path, *extra: str, model: str = "tiny-llama") -> dict:
    out = tmp_path / "out"
    cmd = [sys.executable, str(BENCH / "cold_start.py"), "--out", str(out),
           "--ckpt-dir", str(tmp_path / "ckpt"), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"cold start ({model}" in (out / "cold_start.log").read_text()
    data = json.loads((out / "cold_start.json").read_text())
    assert data["errors"] == []
    return data["shapes"][model]


def _check_start(r: dict, plain_gb_s: float) -> None:
    assert 0 < r["phases"]["weight_load"] < r["ready"] <= r["first_token"]
    assert r["load_fraction"] == pytest.approx(r["load_gb_s"] / plain_gb_s)
    assert r["wake_s"] > 0 and r["first_token_after_wake_s"] > 0
    assert r["exit_code"] == 0


def test_engine_subprocess_starts_on_cpu(tmp_path):
    d = _run(tmp_path, "--smoke", "--engine-only", "--profile")
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
    d = _run(tmp_path, "--shape", "tiny-llama", "--device", "cpu", "--starts", "1", "--bake")
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
    d = _run(tmp_path, "--shape", "tiny-llama", "--device", "cuda", "--starts", "2")
    reads = d["plain_read"]
    assert reads["warm"]["pinned"]
    # --cold-starts (default 2) of the starts follow a page-cache drop, where the machine
    # allows one: each start's load speed is a fraction of the plain read in its state
    for name in ("start1", "start2"):
        r = d[name]
        assert r["page_cache"] == ("cold" if d["drop_caches"]["ok"] else "warm")
        _check_start(r, reads[r["page_cache"]]["gb_s"])
    # serve made the CUDA context beside its imports and warmed the Triton kernels up
    assert {"cuda_context", "kernel_warmup"} <= set(d["start2"]["phases"])
    assert d["phase_table"][0].split(" | ")[0:3] == ["start", "import", "cuda_context"]


def test_model_folder_and_bad_arguments(tmp_path):
    from random_checkpoint import make_random_checkpoint

    ckpt = make_random_checkpoint("tiny-llama", "awq", tmp_path / "mine", 128, "cpu")
    d = _run(tmp_path, str(ckpt), "--device", "cpu", "--engine-only", "--starts", "1",
             "--no-device-prep", model="mine")
    assert d["checkpoint"] == str(ckpt) and d["start1"]["exit_code"] == 0
    assert d["start1"]["prep"] is None  # --no-device-prep: the worker started none
    for bad, word in (([str(tmp_path)], "config.json"),
                      ([str(ckpt), "--shape", "tiny-llama"], "not both"),
                      (["--starts", "0"], "--starts"),
                      (["--smoke", "--profile"], "--profile needs --engine-only"),
                      (["--smoke", "--no-device-prep"], "--no-device-prep needs --engine-only")):
        res = subprocess.run([sys.executable, str(BENCH / "cold_start.py"), *bad,
                              "--device", "cpu", "--out", str(tmp_path / "x")],
                             capture_output=True, text=True, timeout=120, env=ENV)
        assert res.returncode != 0 and word in res.stderr, (bad, res.stderr[-500:])
