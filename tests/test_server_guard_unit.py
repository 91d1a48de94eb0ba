"""HTTP-layer hardening over the fake engine (no model, fast): sleep racing requests, wake-up
and engine failures as 503 / one logged traceback, admission by sequences, and the guard's
host and flag parsing. The same behaviour on the real server: test_server_hostile.py."""

from __future__ import annotations

import asyncio
import logging
import random
from contextlib import contextmanager

import httpx
import pytest
from litestar.testing import AsyncTestClient

from edge_llm.config import ServerConfig
from edge_llm.flags import parse_limit, parse_str_list
from edge_llm.server.guard import is_loopback_host, split_host
from edge_llm.server.terminal_chat import ThreadedServer
from tests.test_lifecycle import SleepyEngine, build

pytestmark = pytest.mark.anyio
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


class SlowSleeper(SleepyEngine):
    """Sleep and wake-up take a while, as they do on a GPU: the window a request can race."""

    def __init__(self, *args, fail_wake: bool = False, **kw) -> None:
        super().__init__(*args, **kw)
        self.fail_wake = fail_wake

    async def sleep(self, level: int = 1) -> None:
        if self.active:
            raise ValueError(f"Cannot sleep with {len(self.active)} requests in flight.")
        self.is_sleeping = True  # the engine refuses work from the start of its sleep
        await asyncio.sleep(0.05)
        self.sleep_calls.append(level)

    async def wake_up(self) -> None:
        await asyncio.sleep(0.05)
        if self.fail_wake:
            raise RuntimeError("CUDA error: out of memory while restoring the weights")
        await super().wake_up()


@contextmanager
def served(app):
    """The app on a real socket (uvicorn in a thread): Litestar's AsyncTestClient runs one
    request at a time, so no race could happen through it."""
    server = ThreadedServer(app)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


async def test_requests_racing_sleep_wait_for_the_wake_up(fake_tokenizer, token_scripts):
    engine = SlowSleeper(fake_tokenizer, token_scripts, step_delay=0.002)
    with served(build(engine)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            assert (await c.get("/v1/models")).status_code == 200
            for _ in range(5):
                delay = random.uniform(0, 0.03)

                async def chat(delay: float = delay):
                    await asyncio.sleep(delay)
                    return await c.post("/v1/chat/completions", json=CHAT)

                results = await asyncio.gather(c.post("/sleep"), *(chat() for _ in range(10)))
                assert results[0].status_code in (200, 409), results[0].text
                assert [r.status_code for r in results[1:]] == [200] * 10, \
                    [r.text for r in results[1:] if r.status_code != 200]
    assert engine.sleep_calls  # the race was real: the engine did sleep


async def test_a_failed_wake_up_is_a_503_logged_once(fake_tokenizer, token_scripts, caplog):
    engine = SlowSleeper(fake_tokenizer, token_scripts, fail_wake=True)
    async with AsyncTestClient(build(engine)) as c:
        assert (await c.post("/sleep")).status_code == 200
        with caplog.at_level(logging.ERROR, logger="edge_llm.server"):
            r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503 and r.headers["retry-after"]
        assert "failed to wake up" in r.json()["error"]["message"]
        records = [rec for rec in caplog.records if rec.exc_info]
        assert len(records) == 1 and "out of memory" in str(records[0].exc_info[1])


async def test_engine_failure_is_logged_once_with_its_traceback(fake_tokenizer, token_scripts,
                                                                caplog):
    engine = SleepyEngine(fake_tokenizer, token_scripts)
    engine.fail_at_step = 1
    async with AsyncTestClient(build(engine)) as c:
        with caplog.at_level(logging.WARNING):
            r = await c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error"
            s = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert s.status_code == 200 and s.text.endswith("data: [DONE]\n\n")
        assert '"engine_error"' in s.text
    failures = [rec for rec in caplog.records if "simulated engine failure" in
                (rec.getMessage() + str(rec.exc_info and rec.exc_info[1]))]
    assert len(failures) == 2 and all(rec.exc_info for rec in failures), \
        [rec.getMessage() for rec in caplog.records]


async def test_admission_counts_sequences_not_requests(fake_tokenizer, token_scripts):
    """max_num_seqs 8, max_queue 4: requests of n=4 fill it after three (12 sequences); the
    fourth gets 429, and one larger than 12 can never be admitted (400)."""
    engine = SleepyEngine(fake_tokenizer, token_scripts, step_delay=0.05)
    app = build(engine, max_queue=4)
    body = {"prompt": "Hi", "n": 4, "max_tokens": 40}
    holder = app.state.ctx.holder
    with served(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            tasks = [asyncio.create_task(c.post("/v1/completions", json=body))
                     for _ in range(3)]
            for _ in range(200):
                if holder.in_flight == 12:
                    break
                await asyncio.sleep(0.01)
            assert holder.in_flight == 12
            r = await c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
            assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
            r = await c.post("/v1/completions", json={"prompt": ["a", "b"], "n": 7})
            assert r.status_code == 400 and r.json()["error"]["param"] == "n"
            assert "14 sequences" in r.json()["error"]["message"]
            assert [t.status_code for t in await asyncio.gather(*tasks)] == [200] * 3
            assert holder.in_flight == 0


@pytest.mark.parametrize("host,loopback", [
    ("localhost", True), ("LocalHost", True), ("a.b.localhost", True), ("127.0.0.1", True),
    ("127.255.0.9", True), ("::1", True), ("[::1]", True), ("0.0.0.0", False),
    ("10.0.0.1", False), ("localhost.evil.com", False), ("evil.com", False), ("", False),
])
def test_loopback_hosts(host, loopback):
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize("value,host", [("a.com:80", "a.com"), ("[::1]:8000", "::1"),
                                        ("::1", "::1"), ("127.0.0.1", "127.0.0.1")])
def test_split_host(value, host):
    assert split_host(value) == host


def test_flag_parsers_and_config_checks():
    assert parse_str_list('["http://a.com", "http://b.com"]') == ("http://a.com",
                                                                  "http://b.com")
    assert parse_str_list("http://a.com, *") == ("http://a.com", "*")
    with pytest.raises(ValueError, match="JSON list"):
        parse_str_list('["a", 1]')
    assert parse_limit("none") is None and parse_limit("12") == 12
    with pytest.raises(ValueError):
        parse_limit("0")
    with pytest.raises(ValueError, match="max_messages"):
        ServerConfig(max_messages=0)
    with pytest.raises(ValueError, match="body_read_timeout"):
        ServerConfig(body_read_timeout=0)
