"""``edge-llm warmup``: the serve start-up up to ready, then exit 0 with the caches named; a
model that fails to load exits 1 in one line; bad flags exit 2. On a CPU nothing is compiled
(the torch references run), so the cache summary counts none; the GPU side is the cold-start
benchmark's (Triton files and probe results appear under the cache directory)."""

from __future__ import annotations

from tests.engine_fixtures import demo_dir, tiny_dir  # noqa: F401
from tests.test_cli import run_cli


def test_warmup_starts_as_serve_does_and_exits(tiny_dir, tmp_path):  # noqa: F811
    cache = tmp_path / "cache"
    res = run_cli("warmup", str(tiny_dir), "--device", "cpu", "--max-model-len", "128",
                  "--max-num-seqs", "2", env={"EDGE_LLM_CACHE_DIR": str(cache)}, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    log = res.stderr
    for phase in ("import", "weight_load", "kv_allocation", "warmup", "ready"):
        assert f"startup phase {phase}: " in log, phase
    assert "Warm-up generated" in log  # the built-in warm-up requests ran
    done = [ln for ln in log.splitlines() if "Warm-up only: done." in ln]
    assert len(done) == 1 and f"{cache} keeps 0 Triton cache files (0.0 MB)" in done[0]
    assert "Uvicorn running" not in log and "Listening" not in log  # no server, no port
    assert (cache / "triton").is_dir() is False  # nothing compiled on a CPU


def test_warmup_of_a_model_that_fails_to_load_exits_1(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"]}')
    res = run_cli("warmup", str(tmp_path), "--device", "cpu", "--log-level", "error",
                  timeout=300)
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("edge-llm warmup: error: the model failed to load:")
    assert "Traceback" not in res.stderr and "ValueError" not in last  # worded as serve does


def test_warmup_bad_flags_exit_2_and_missing_model_exits_1(tmp_path):
    res = run_cli("warmup", "--max-num-seqs", "zero")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--max-num-seqs" in res.stderr
    res = run_cli("warmup", str(tmp_path / "missing"))
    assert res.returncode == 1
    assert res.stderr.strip() == f"edge-llm warmup: error: model folder not found: " \
                                 f"{tmp_path / 'missing'}"

