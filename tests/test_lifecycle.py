"""Lifecycle unit tests over the fake engine (no model): /ping and /health per state, sleep and
wake routes (409 in flight, API key), wake on request, hooks, warm-up (built-in shapes and user
bodies), SageMaker /invocations, compile-cache variables and the serve flags behind them."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import threading

import pytest
from litestar.testing import AsyncTestClient

from edge_llm.config import EngineConfig, SchedulerConfig, ServerConfig
from edge_llm.server import create_app
from edge_llm.server.hooks import (
    LifecycleConfig,
    load_hook,
    read_warmup_prompts,
    set_compile_cache_env,
)
from tests.test_server_fake_engine import TEST_CLIENT_HOSTS, FakeEngine, sse_payloads

pytestmark = pytest.mark.anyio


class SleepyEngine(FakeEngine):
    """The fake engine plus AsyncEngine's sleep API (ValueError while requests run)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.sleep_calls: list[int] = []
        self.wake_calls = 0
        self.is_sleeping = False

    async def sleep(self, level: int = 1) -> None:
        if self.active:
            raise ValueError(f"Cannot sleep with {len(self.active)} requests in flight.")
        self.sleep_calls.append(level)
        self.is_sleeping = True

    async def wake_up(self) -> None:
        self.wake_calls += 1
        self.is_sleeping = False

    async def generate(self, prompt, params, request_id):
        assert not self.is_sleeping, "generate on a sleeping engine"
        async for out in super().generate(prompt, params, request_id):
            yield out


def build(engine, lifecycle: LifecycleConfig | None = None, gate: threading.Event | None = None,
          **server_kw):
    def factory():
        if gate is not None:
            assert gate.wait(30)
        return engine

    server_kw.setdefault("log_requests", False)
    server_kw.setdefault("allowed_hosts", TEST_CLIENT_HOSTS)
    server_kw.setdefault("enable_sleep_endpoints", True)
    return create_app(EngineConfig(scheduler=SchedulerConfig(max_num_seqs=8)),
                      ServerConfig(**server_kw), engine_factory=factory, lifecycle=lifecycle)


async def test_ping_and_health_while_loading_then_ready(fake_tokenizer, token_scripts):
    gate = threading.Event()
    app = build(SleepyEngine(fake_tokenizer, token_scripts), gate=gate)
    async with AsyncTestClient(app) as c:
        assert (await c.get("/ping")).status_code == 204
        r = await c.get("/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        gate.set()
        for _ in range(200):
            if (await c.get("/health")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        r = await c.get("/ping")
        assert r.status_code == 200 and r.json()["state"] == "ready"
        metrics = (await c.get("/metrics")).text
        assert 'edge_llm:startup_phase_seconds{phase="ready"}' in metrics


@pytest.mark.parametrize("loads", [True, False])
async def test_the_cyclic_gc_is_off_while_loading_then_frozen(fake_tokenizer, token_scripts,
                                                              loads):
    """freeze_gc (serve): the GC is off while the factory runs and on again after ready, the
    start-up objects frozen; a failed load turns it back on too."""
    seen: list[bool] = []

    def factory():
        seen.append(gc.isenabled())
        if not loads:
            raise RuntimeError("no model here")
        return SleepyEngine(fake_tokenizer, token_scripts)

    app = create_app(EngineConfig(scheduler=SchedulerConfig(max_num_seqs=8)),
                     ServerConfig(log_requests=False, allowed_hosts=TEST_CLIENT_HOSTS),
                     engine_factory=factory, on_load_failure=lambda exc: None,
                     lifecycle=LifecycleConfig(freeze_gc=True, warmup=False))
    assert gc.isenabled()
    try:
        async with AsyncTestClient(app) as c:
            for _ in range(500):  # until the load has ended, either way
                if seen and gc.isenabled():
                    break
                await asyncio.sleep(0.01)
            assert seen == [False] and gc.isenabled()
            assert (await c.get("/health")).status_code == (200 if loads else 503)
            assert (gc.get_freeze_count() > 0) is loads
    finally:
        gc.enable()
        gc.unfreeze()


async def test_sleep_wake_routes_and_wake_on_request(fake_tokenizer, token_scripts):
    engine = SleepyEngine(fake_tokenizer, token_scripts)
    async with AsyncTestClient(build(engine, api_key="k3y")) as c:
        auth = {"Authorization": "Bearer k3y"}
        assert (await c.post("/sleep")).status_code == 401
        assert (await c.post("/sleep", params={"level": 3}, headers=auth)).status_code == 400
        r = await c.post("/sleep", params={"level": 2}, headers=auth)
        assert r.status_code == 200 and r.json() == {"is_sleeping": True, "changed": True}
        assert engine.sleep_calls == [2]
        r = await c.get("/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == "asleep"
        assert (await c.get("/ping")).status_code == 200  # can take requests: it wakes
        n = random.randint(2, 6)
        r = await c.post("/v1/completions", headers=auth,
                         json={"prompt": "Hello", "max_tokens": n})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == n
        assert engine.wake_calls == 1 and not engine.is_sleeping
        r = await c.post("/wake_up", headers=auth)
        assert r.json() == {"is_sleeping": False, "changed": False}


async def test_sleep_refused_with_409_while_requests_are_in_flight(fake_tokenizer,
                                                                   token_scripts):
    engine = SleepyEngine(fake_tokenizer, token_scripts)
    app = build(engine)
    async with AsyncTestClient(app) as c:
        assert (await c.get("/v1/models")).status_code == 200
        ticket = app.state.ctx.holder.acquire(random.randint(1, 3))  # admitted by the server
        r = await c.post("/sleep")
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "requests_in_flight"
        ticket.release()
        engine.active["not-yet-seen-by-the-server"] = 1  # the engine's own check (ValueError)
        r = await c.post("/sleep")
        assert r.status_code == 409 and "in flight" in r.json()["error"]["message"]
        assert engine.sleep_calls == [] and (await c.get("/health")).status_code == 200
        engine.active.clear()
        assert (await c.post("/sleep")).status_code == 200 and engine.sleep_calls == [1]


async def test_idle_sleep_and_hooks_see_every_event(fake_tokenizer, token_scripts, tmp_path,
                                                    monkeypatch):
    log = tmp_path / "events.txt"
    (tmp_path / "unit_hook_mod.py").write_text(
        "import pathlib\n"
        f"LOG = pathlib.Path({str(log)!r})\n"
        "async def on_event(event, state):\n"
        "    with LOG.open('a') as f:\n"
        "        f.write(event + ':' + str(state.ctx.holder.state) + '\\n')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    engine = SleepyEngine(fake_tokenizer, token_scripts)
    lifecycle = LifecycleConfig(idle_sleep_s=0.2, sleep_level=1, warmup=False,
                                hooks=("unit_hook_mod:on_event",))
    async with AsyncTestClient(build(engine, lifecycle)) as c:
        for _ in range(300):
            if engine.sleep_calls:
                break
            await asyncio.sleep(0.01)
        assert engine.sleep_calls == [1]
        r = await c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        assert r.status_code == 200
    events = log.read_text().split()
    assert events[:4] == ["on_load:loading", "on_ready:ready", "on_sleep:asleep",
                          "on_wake:ready"]
    sys.modules.pop("unit_hook_mod", None)


async def test_warmup_runs_builtin_shapes_and_user_bodies_before_ready(
        fake_tokenizer, token_scripts, tmp_path, rng):
    words = ["lamp", "orbit", "seven", "north"]
    prompt = " ".join(rng.choice(words) for _ in range(5))
    chat = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
    path = tmp_path / "warm.jsonl"
    path.write_text(f"{prompt}\n\n{json.dumps(chat)}\n")
    bodies = read_warmup_prompts(path)
    assert bodies[0] == {"prompt": prompt, "max_tokens": 8} and bodies[1] == chat
    engine = SleepyEngine(fake_tokenizer, token_scripts)
    lifecycle = LifecycleConfig(warmup=True, warmup_batch=3, warmup_tokens=2,
                                warmup_prompts=bodies)
    async with AsyncTestClient(build(engine, lifecycle)) as c:
        assert (await c.get("/v1/models")).status_code == 200  # waits for ready
        sizes = [p.max_tokens for _, p in engine.requests]
        # batch 1, then a batch of 3, then the two user bodies
        assert sizes == [2, 2, 2, 2, 8, 2]
        assert fake_tokenizer.decode(engine.requests[4][0]) == prompt
        assert all(p.ignore_eos for _, p in engine.requests[:4])
        assert (await c.get("/health")).status_code == 200


def test_bad_warmup_files_and_hooks_name_the_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('ok prompt\n{"prompt": "x", "messages": []}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        read_warmup_prompts(bad)
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: invalid JSON"):
        read_warmup_prompts(bad)
    with pytest.raises(ValueError, match="missing.txt"):
        read_warmup_prompts(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="module:function"):
        LifecycleConfig(hooks=("no_colon",))
    with pytest.raises(ValueError, match="has no function 'nope'"):
        load_hook("json:nope")
    with pytest.raises(ValueError, match="cannot import"):
        load_hook("edge_llm_no_such_module:f")
    with pytest.raises(ValueError, match="sleep_level"):
        LifecycleConfig(sleep_level=3)


async def test_sagemaker_invocations_answer_like_chat_and_completions(fake_tokenizer,
                                                                     token_scripts):
    engine = SleepyEngine(fake_tokenizer, token_scripts)
    n = random.randint(2, 5)
    async with AsyncTestClient(build(engine, LifecycleConfig(sagemaker=True, warmup=False))) as c:
        r = await c.post("/invocations", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": n})
        assert r.status_code == 200 and r.json()["object"] == "chat.completion"
        assert r.json()["choices"][0]["message"]["content"] == \
            fake_tokenizer.decode(token_scripts[0][:n])
        r = await c.post("/invocations", json={"prompt": "Hi", "max_tokens": n, "stream": True})
        chunks = sse_payloads(r.text)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert (await c.post("/invocations", content=b"{oops")).status_code == 400
        r = await c.post("/invocations", json={"max_tokens": 2})
        assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    async with AsyncTestClient(build(engine)) as c:  # not in SageMaker mode: no route
        assert (await c.post("/invocations", json={"prompt": "Hi"})).status_code in (404, 405)


def test_compile_cache_env_and_serve_lifecycle_flags(tmp_path):
    from edge_llm.cli import SERVE_OPTIONS, UsageError, build_lifecycle, resolve_options

    env = {"EDGE_LLM_CACHE_DIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": "/mine"}
    assert set_compile_cache_env(env) == {"TRITON_CACHE_DIR": str(tmp_path / "triton")}
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/mine"

    def lifecycle(argv: dict, environ: dict):
        args = argparse.Namespace(**{o.dest: None for o in SERVE_OPTIONS})
        vars(args).update(argv)
        args.port_given = args.port is not None
        resolve_options(args, SERVE_OPTIONS, environ)
        return args, build_lifecycle(args, environ)

    args, lc = lifecycle({"idle_sleep_s": 7.5, "hook": "a:b, c.d:e"},
                         {"SAGEMAKER_BIND_TO_PORT": "9090"})
    assert lc.sagemaker and args.port == 9090 and args.host == "0.0.0.0"
    assert lc.idle_sleep_s == 7.5 and lc.hooks == ("a:b", "c.d:e") and lc.warmup
    assert lc.freeze_gc and not LifecycleConfig().freeze_gc  # serve only
    args, lc = lifecycle({"sagemaker": True, "port": 7000}, {})
    assert lc.sagemaker and args.port == 7000
    args, lc = lifecycle({}, {"EDGE_LLM_SLEEP_LEVEL": "2"})
    assert not lc.sagemaker and lc.sleep_level == 2 and args.port == 8000
    with pytest.raises(UsageError, match="--warmup-prompts"):
        lifecycle({"warmup_prompts": str(tmp_path / "none.txt")}, {})
    with pytest.raises(UsageError, match="idle_sleep_s"):
        lifecycle({"idle_sleep_s": -1.0}, {})
