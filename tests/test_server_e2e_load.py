"""End-to-end under load: 32 concurrent streaming clients get the texts they get alone (greedy),
and a client leaving mid-stream gets its request aborted (KV blocks back to the idle count)."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import openai

TOPICS = ["the sea", "a cat", "winter", "trains", "music", "the moon", "bread", "a forest"]


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} ([0-9.e+-]+)$", text, re.M)
    assert m, name
    return float(m[1])


def test_32_concurrent_streams_match_solo_runs(live_server, rng):
    prompts = [f"Write one sentence about {t}." for t in rng.sample(TOPICS, 4)]

    async def stream_one(client: openai.AsyncOpenAI, prompt: str) -> str:
        stream = await client.chat.completions.create(
            model="SmolLM2-135M-Instruct-AWQ", messages=[{"role": "user", "content": prompt}],
            temperature=0, max_tokens=5, stream=True)
        parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        return "".join(parts)

    async def run() -> tuple[list[str], list[str]]:
        client = openai.AsyncOpenAI(base_url=live_server.url + "/v1", api_key="x",
                                    max_retries=0, timeout=300)
        solo = [await stream_one(client, p) for p in prompts]
        together = await asyncio.gather(*[stream_one(client, prompts[i % 4])
                                          for i in range(32)])
        await client.close()
        return solo, list(together)

    solo, together = asyncio.run(run())
    assert all(solo)
    assert together == [solo[i % 4] for i in range(32)]


def test_disconnect_mid_stream_frees_kv_blocks(live_server):
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        idle = http.get("/metrics").text
        idle_free = metric(idle, "edge_llm:num_free_blocks")
        body = {"prompt": "Once upon a time", "max_tokens": 900, "temperature": 0.8,
                "ignore_eos": True, "stream": True}
        seen = 0
        with http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    seen += 1
                if seen == 3:
                    during = http.get("/metrics").text
                    assert metric(during, "vllm:num_requests_running") == 1
                    assert metric(during, "edge_llm:num_free_blocks") < idle_free
                    break  # leaving the block closes the connection mid-stream
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            now = http.get("/metrics").text
            if (metric(now, "edge_llm:num_free_blocks") == idle_free
                    and metric(now, "vllm:num_requests_running") == 0):
                break
            time.sleep(0.1)
        assert metric(now, "edge_llm:num_free_blocks") == idle_free
        assert metric(now, "vllm:num_requests_running") == 0
        assert metric(now, "vllm:num_requests_waiting") == 0
        ok = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert ok.status_code == 200
