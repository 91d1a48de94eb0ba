"""vLLM's tokenizer routes over the fake engine: the API key guards them like /v1, and a
sleeping engine still answers from its tokenizer. Shapes and real requests are checked against
a real server in ``test_first_hour_e2e.py``."""

from __future__ import annotations

import asyncio

import pytest
from litestar.testing import AsyncTestClient

from tests.test_server_fake_engine import FakeEngine, make_app

pytestmark = pytest.mark.anyio


async def test_api_key_guards_the_tokenizer_routes(fake_tokenizer, token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts)
    async with AsyncTestClient(make_app(engine, api_key="sesame")) as c:
        for method, path, body in (("post", "/tokenize", {"prompt": "hi"}),
                                   ("post", "/detokenize", {"tokens": [1]}),
                                   ("get", "/tokenizer_info", None)):
            kw = {"json": body} if body is not None else {}
            r = await getattr(c, method)(path, **kw)
            assert r.status_code == 401, (path, r.text)
            r = await getattr(c, method)(path, headers={"Authorization": "Bearer sesame"}, **kw)
            assert r.status_code == 200, (path, r.text)


class SleepyEngine(FakeEngine):
    """Counts wake-ups: the tokenizer routes must not wake it."""

    wakes = 0

    async def sleep(self, level: int = 1) -> None:
        pass

    async def wake_up(self) -> None:
        self.wakes += 1


async def test_a_sleeping_engine_still_tokenizes(fake_tokenizer, token_scripts):
    engine = SleepyEngine(fake_tokenizer, token_scripts)
    async with AsyncTestClient(make_app(engine, enable_sleep_endpoints=True)) as c:
        for _ in range(200):  # the engine loads in the background; /sleep needs it loaded
            if (await c.get("/health")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        assert (await c.post("/sleep")).status_code == 200
        r = await c.post("/tokenize", json={"prompt": "Hello world"})
        assert r.status_code == 200 and r.json()["tokens"] == fake_tokenizer.encode("Hello world")
        assert (await c.get("/is_sleeping")).json() == {"is_sleeping": True}
        info = (await c.get("/tokenizer_info")).json()
        assert info["eos_token"] == fake_tokenizer.eos_token
        assert info["chat_template"] == fake_tokenizer.chat_template
        assert engine.wakes == 0
