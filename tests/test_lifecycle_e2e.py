"""Scale to zero with a real ``edge-llm serve`` process on the demo model (one per module):
/ping and /health while loading, start-up phases in /metrics, warm-up prompts and hooks, idle
sleep and wake on request, /sleep and /wake_up, and SIGTERM draining a live stream (exit 0)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import SERVER_START_TIMEOUT, free_port

HOOK_MODULE = '''
import os
def record(event, state):
    with open(os.environ["EDGE_LLM_TEST_HOOK_LOG"], "a") as f:
        f.write(event + " " + type(state.ctx).__name__ + "\\n")
'''
WORDS = ["river", "seven", "blue", "lamp", "orbit", "pepper", "quiet", "north", "violin"]


def _prompt(rng: random.Random, n: int = 6) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def server(tmp_path_factory, module_rng):
    """(url, process, hook log, observations while loading); terminated at the end."""
    tmp = tmp_path_factory.mktemp("lifecycle")
    (tmp / "lifecycle_hook_mod.py").write_text(HOOK_MODULE)
    rng = module_rng
    chat = {"messages": [{"role": "user", "content": _prompt(rng)}], "max_tokens": 2}
    (tmp / "warm.txt").write_text(_prompt(rng) + "\n\n" + json.dumps(chat) + "\n")
    hook_log, log = tmp / "hooks.log", tmp / "serve.log"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_LLM_")
           or k == "EDGE_LLM_CACHE_DIR"}
    env.update(EDGE_LLM_TEST_HOOK_LOG=str(hook_log),
               PYTHONPATH=os.pathsep.join([str(tmp), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "edge_llm.cli", "serve", "--port", str(port),
           "--max-model-len", "256", "--max-num-seqs", "4", "--idle-sleep-s", "4",
           "--warmup-prompts", str(tmp / "warm.txt"), "--hook", "lifecycle_hook_mod:record",
           "--drain-timeout", "300", "--enable-sleep-endpoints"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    seen: set[tuple[int, int]] = set()  # (ping status, health status) pairs while starting
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    try:
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                ping = httpx.get(url + "/ping", timeout=5).status_code
                health = httpx.get(url + "/health", timeout=5).status_code
            except httpx.HTTPError:
                time.sleep(0.2)
                continue
            seen.add((ping, health))
            if health == 200:
                break
            time.sleep(0.2)
        else:
            pytest.fail("not ready:\n" + log.read_text(errors="replace")[-3000:])
        yield url, proc, hook_log, seen, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _completion(url: str, rng: random.Random, max_tokens: int = 2) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=300,
                      json={"prompt": _prompt(rng), "max_tokens": max_tokens})


def test_start_ping_health_phases_and_hooks(server):
    url, _, hook_log, seen, log = server
    assert (204, 503) in seen, seen  # initialising: RunPod's 204, health 503
    assert httpx.get(url + "/ping").status_code == 200
    metrics = httpx.get(url + "/metrics").text
    for phase in ("import", "weight_load", "kv_allocation", "warmup", "ready"):
        assert f'edge_llm:startup_phase_seconds{{phase="{phase}"}}' in metrics, phase
    text = log.read_text(errors="replace")
    assert "startup phase weight_load" in text and "GB/s" in text
    assert "Prefetch: " in text  # the checkpoint asked into the page cache (or not on disk)
    assert "start-up objects out of the cyclic GC" in text  # serve freezes them once ready
    events = hook_log.read_text().split("\n")
    assert events[:2] == ["on_load ServerContext", "on_ready ServerContext"]


def test_idle_sleep_then_wake_on_request_and_sleep_routes(server, rng):
    url, _, hook_log, _, _ = server
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # --idle-sleep-s 4 after the last request
        r = httpx.get(url + "/health")
        if r.status_code == 503 and r.json()["error"]["code"] == "asleep":
            break
        time.sleep(0.5)
    else:
        pytest.fail("the engine did not fall asleep when idle")
    r = _completion(url, rng)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2
    assert httpx.get(url + "/health").status_code == 200
    events = hook_log.read_text().split()
    assert "on_sleep" in events and "on_wake" in events
    r = httpx.post(url + "/sleep", params={"level": 1}, timeout=60)
    assert r.status_code == 200 and r.json()["is_sleeping"] is True
    assert httpx.get(url + "/is_sleeping").json() == {"is_sleeping": True}
    assert _sleep_state(url) == {"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0}
    r = httpx.post(url + "/wake_up", timeout=300)
    assert r.status_code == 200 and r.json() == {"is_sleeping": False, "changed": True}
    assert _sleep_state(url) == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}


def _sleep_state(url: str) -> dict[str, float]:
    """vllm:engine_sleep_state's value per sleep_state label, from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics").text
    return {s.labels["sleep_state"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "vllm:engine_sleep_state" for s in f.samples}


def test_sigterm_drains_a_stream_and_exits_zero(server, rng):
    url, proc, _, _, log = server
    body = {"prompt": _prompt(rng), "max_tokens": 12, "ignore_eos": True, "stream": True}
    chunks, done, finish = 0, False, None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                chunks += 1
                break
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        try:  # a new request: a refused connection (socket closed) or 503 (the gate)
            late = httpx.post(url + "/v1/completions", timeout=10,
                              json={"prompt": _prompt(rng), "max_tokens": 2}).status_code
        except httpx.TransportError:
            late = None
        assert late in (None, 503), late
        for line in lines:
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                chunks += 1
                finish = json.loads(line[6:])["choices"][0]["finish_reason"] or finish
    assert done and finish == "length" and chunks >= 2, (chunks, finish,
                                                           log.read_text(errors="replace")[-2000:])
    assert proc.wait(timeout=120) == 0, Path(log).read_text(errors="replace")[-2000:]
