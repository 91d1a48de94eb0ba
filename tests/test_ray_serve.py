"""recipes/ray-serve on CPU: two edge-llm replicas of the demo model behind Ray Serve's proxy.

In order, on one local Ray cluster: requests spread over both replicas; one replica killed while
streams run on both (its streams end with an error, none hang; new requests are served by the
rest); then, with a short downscale delay, the deployment scales to zero replicas and the next
request starts one and is served. Each replica is a whole edge-llm app, so this is the slowest
CPU test (two model loads plus a replacement and a scale-up from zero), capped by its timeout.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ray = pytest.importorskip("ray", reason="ray[serve] is not installed (pip install -e .[test])")
serve = pytest.importorskip("ray.serve")

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "ray-serve"
sys.path.insert(0, str(RECIPE))
from edge_llm_ray import REPLICA_HEADER, deployment  # noqa: E402

from tests.conftest import free_port  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SERVE_ARGS = ["--max-model-len", "512", "--max-num-seqs", "4", "--seed", "0"]
REPLICA = REPLICA_HEADER.decode()
APP = "edge-llm"


def _app(downscale_delay_s: float) -> object:
    return deployment(SERVE_ARGS, min_replicas=0, max_replicas=2, initial_replicas=2,
                      target_ongoing_requests=2, max_ongoing_requests=4, upscale_delay_s=1,
                      downscale_delay_s=downscale_delay_s, num_cpus=0.5,
                      health_check_timeout_s=300)


@pytest.fixture(scope="module")
def ray_url() -> Iterator[str]:
    port = free_port()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{ROOT}:{RECIPE}",
                                       "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(_app(downscale_delay_s=600), name=APP, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _chat(url: str, max_tokens: int = 6, **extra) -> httpx.Response:
    body = {"model": "SmolLM2-135M-Instruct-AWQ", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}], **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=240)


def _concurrently(fn, n: int) -> list:
    results: list = [None] * n

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except Exception as exc:  # kept: the caller asserts on it
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=260)
    assert not any(t.is_alive() for t in threads), "a request hung"
    return results


def _replicas() -> dict[str, object]:
    """Live replica actors of the app, by replica id."""
    out = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"]
        if name.startswith(f"SERVE_REPLICA::{APP}#"):
            out[name.rsplit("#", 1)[1]] = ray.get_actor(name, namespace=actor["namespace"])
    return out


def test_requests_spread_over_both_replicas(ray_url: str):
    assert len(_replicas()) == 2
    results = _concurrently(lambda i: _chat(ray_url), 8)
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in results), results
    assert all(r.json()["choices"][0]["message"]["content"] for r in results)
    served = {r.headers[REPLICA] for r in results}
    assert served == set(_replicas()), served


def _stream(url: str, started: threading.Event, replicas: list[str]) -> str:
    """One streamed completion: "done" ([DONE] seen), or the error it ended with."""
    body = {"model": "SmolLM2-135M-Instruct-AWQ", "max_tokens": 120, "ignore_eos": True,
            "stream": True, "messages": [{"role": "user", "content": "Tell a story."}]}
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                          timeout=httpx.Timeout(60, read=30)) as r:
            replicas.append(r.headers[REPLICA])
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    started.set()
                    if line == "data: [DONE]":
                        return f"done {r.headers[REPLICA]}"
                    if '"error"' in line:
                        return f"error event {r.headers[REPLICA]}: {line}"
            return f"ended without [DONE] {r.headers[REPLICA]}"
    except httpx.HTTPError as exc:
        return f"error {type(exc).__name__}: {exc}"


def test_killed_replica_ends_its_streams_with_an_error_and_the_other_serves(ray_url: str):
    replicas = _replicas()
    assert len(replicas) == 2
    started, seen = threading.Event(), []
    outcomes: list = []
    runner = threading.Thread(target=lambda: outcomes.extend(
        _concurrently(lambda i: _stream(ray_url, started, seen), 6)))
    runner.start()
    assert started.wait(120), "no stream started"
    time.sleep(1.0)
    victim = seen[0]
    survivor = (set(replicas) - {victim}).pop()
    ray.kill(replicas[victim], no_restart=True)
    # new requests at once, while the streams run and before any replacement could load
    fresh = _concurrently(lambda i: _chat(ray_url), 3)
    runner.join(timeout=200)
    assert not runner.is_alive(), "streams hung after the kill"
    assert len(outcomes) == 6, outcomes
    broken = [o for o in outcomes if not o.startswith("done")]
    # the victim's streams end with a transport error (the chunked body cut short), never a
    # clean end that would pass for a finished reply; the survivor's finish
    assert broken and all(o.startswith("error RemoteProtocolError") for o in broken), outcomes
    assert {o.split()[1] for o in outcomes if o.startswith("done")} == {survivor}, outcomes
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in fresh), fresh
    assert {r.headers[REPLICA] for r in fresh} == {survivor}


def test_scales_to_zero_when_idle_and_back_up_on_a_request(ray_url: str):
    serve.run(_app(downscale_delay_s=2), name=APP, route_prefix="/")  # a config update
    deadline = time.monotonic() + 90
    while _replicas() and time.monotonic() < deadline:
        time.sleep(1)
    assert not _replicas(), "still replicas after 90 s idle"
    r = _chat(ray_url)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    assert len(_replicas()) == 1
