"""recipes/ray-serve on CPU: two edge-llm replicas of the demo model behind Ray Serve's proxy.

In order, on one local Ray cluster: requests spread over both replicas; one replica killed while
streams run on both (its streams end with an error, none hang; new requests are served by the
rest); then, with a short downscale delay, the deployment scales to zero replicas and the next
request starts one and is served; last, the conversation-affinity app on two fresh replicas: a
multi-turn chat workload's prefix-cache hit rate against the same workload on one server (the
session's live server). Each replica is a whole edge-llm app, so this is the slowest CPU module
(five model loads), capped by its timeout.
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
from affinity import rank  # noqa: E402
from edge_llm_ray import REPLICA_HEADER, deployment  # noqa: E402

from tests.conftest import LiveServer, free_port  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # each; the module runs 2-3 min
SERVE_ARGS = ["--max-model-len", "512", "--max-num-seqs", "4", "--seed", "0"]
REPLICA = REPLICA_HEADER.decode()
APP = "edge-llm"


def _app(downscale_delay_s: float, affinity: bool = False, max_ongoing: int = 4) -> object:
    return deployment(SERVE_ARGS, min_replicas=0, max_replicas=2, initial_replicas=2,
                      target_ongoing_requests=2, max_ongoing_requests=max_ongoing,
                      upscale_delay_s=1,
                      downscale_delay_s=downscale_delay_s, num_cpus=0.5,
                      health_check_timeout_s=300, affinity=affinity)


@pytest.fixture(scope="module")
def ray_url() -> Iterator[str]:
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{ROOT}:{RECIPE}",
                                       "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}})
    try:
        for attempt in range(3):  # a free port can be taken before the proxy binds it
            port = free_port()
            try:
                serve.start(http_options={"host": "127.0.0.1", "port": port})
                serve.run(_app(downscale_delay_s=600), name=APP, route_prefix="/")
                break
            except Exception as exc:
                if "Failed to bind" not in str(exc) or attempt == 2:
                    raise
                serve.shutdown()
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
    """Live engine replica actors of the app, by replica id."""
    out = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"]
        if not name.startswith(f"SERVE_REPLICA::{APP}#edge-llm#"):  # the engines only
            continue
        try:
            out[name.rsplit("#", 1)[1]] = ray.get_actor(name, namespace=actor["namespace"])
        except ValueError:  # listed, then stopped before the lookup: not live
            continue
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


def test_rendezvous_rank_is_stable_and_balanced():
    ids = ["a1", "b2", "c3"]
    keys = [f"conversation {i}" for i in range(3000)]
    firsts = [rank(k, ids)[0] for k in keys]
    assert all(600 < firsts.count(r) < 1400 for r in ids), [firsts.count(r) for r in ids]
    # a replica leaving moves only its own conversations
    after = [rank(k, ["a1", "c3"])[0] for k in keys]
    assert all(a == f for f, a in zip(firsts, after, strict=True) if f != "b2")
    assert rank("x", ids) == rank("x", list(reversed(ids)))


def _conversations(url: str, n: int = 6, turns: int = 4) -> list[list[tuple[int, int, str]]]:
    """``n`` concurrent multi-turn chats (each turn sends the whole history back); per turn:
    (prompt tokens, cached prompt tokens, replica or "")."""
    topics = ["rivers", "bread", "clocks", "bees", "glass", "maps", "salt", "bells"]

    def one(i: int) -> list[tuple[int, int, str]]:
        messages = [{"role": "system", "content": f"You are a guide to {topics[i]}. Conversation "
                     f"{i}: answer in one short sentence, plainly, for a curious reader."}]
        out = []
        for turn in range(turns):
            messages.append({"role": "user", "content": f"Tell me fact {turn + 1} about "
                             f"{topics[i]}, please."})
            r = _chat(url, max_tokens=8, messages=messages)
            assert r.status_code == 200, r.text
            body = r.json()
            messages.append({"role": "assistant",
                             "content": body["choices"][0]["message"]["content"]})
            usage = body["usage"]
            out.append((usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"],
                        r.headers.get(REPLICA, "")))
        return out

    results = _concurrently(one, n)
    assert all(isinstance(r, list) for r in results), results
    return results


def _answering_replicas(url: str, want: int, deadline_s: float = 120) -> set[str]:
    """The replicas that answer one-token chats of distinct conversations, sent until ``want``
    of them have. ``serve.run`` returns once the replicas run, but the ingress's router learns
    of them later (the controller's long poll): a conversation started before then stays
    where it began only until the router sees the replica its key ranks first."""
    seen: set[str] = set()
    end, i = time.monotonic() + deadline_s, 0
    while len(seen) < want and time.monotonic() < end:
        r = _chat(url, max_tokens=1, messages=[
            {"role": "system", "content": f"Warm-up conversation {i}."},
            {"role": "user", "content": "Hi."}])
        assert r.status_code == 200, r.text
        seen.add(r.headers.get(REPLICA, ""))
        i += 1
    return seen


def _hit_rate(results: list[list[tuple[int, int, str]]]) -> float:
    turns = [t for conv in results for t in conv]
    return sum(c for _, c, _ in turns) / sum(p for p, _, _ in turns)


def test_conversation_affinity_keeps_the_prefix_cache_hit_rate(ray_url: str,
                                                                live_server: LiveServer):
    serve.delete(APP)
    # room for every conversation on one replica: a full replica would (rightly) pass a turn
    # to the next in rank, which is not what this measures
    serve.run(_app(downscale_delay_s=600, affinity=True, max_ongoing=8), name=APP,
              route_prefix="/")
    assert len(_replicas()) == 2
    assert len(_answering_replicas(ray_url, 2)) == 2  # the router knows both before a turn
    fleet = _conversations(ray_url)
    for conv in fleet:  # every turn of a conversation on one replica
        assert len({replica for _, _, replica in conv}) == 1, conv
    single = _conversations(live_server.url)
    fleet_rate, single_rate = _hit_rate(fleet), _hit_rate(single)
    assert single_rate > 0.3, single_rate  # the workload does reuse its prefixes
    assert fleet_rate >= 0.9 * single_rate, (fleet_rate, single_rate)
