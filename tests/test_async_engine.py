"""AsyncEngine: concurrent streams, deltas, abort, and a failing step that spares the loop."""

from __future__ import annotations

import asyncio

import pytest

from edge_llm import SamplingParams
from edge_llm.config import EngineConfig, ModelConfig, SchedulerConfig
from edge_llm.engine.async_engine import AsyncEngine, EngineError
from tests.engine_fixtures import demo_dir, tiny_dir  # noqa: F401

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_dir):  # noqa: F811
    cfg = EngineConfig(model=ModelConfig(model=str(tiny_dir), device="cpu"),
                       scheduler=SchedulerConfig(max_num_batched_tokens=256))
    return AsyncEngine.from_config(cfg)


async def _collect(engine, prompt, params, rid):
    deltas, last = [], None
    async for out in engine.generate(prompt, params, rid):
        deltas.append(out.outputs[0].token_ids_delta)
        last = out
    return deltas, last


def _idle(engine):
    st = engine.stats()
    assert st["num_free_blocks"] == st["num_total_blocks"]
    engine.engine.check_integrity()


def test_concurrent_streams_match_alone(engine):
    prompts = [{"prompt_token_ids": list(range(200 + i, 230 + 3 * i))} for i in range(6)]

    async def main():
        await engine.start()
        alone = [await _collect(engine, p, GREEDY, f"s{i}") for i, p in enumerate(prompts)]
        together = await asyncio.gather(
            *[_collect(engine, p, GREEDY, f"c{i}") for i, p in enumerate(prompts)]
        )
        return alone, together

    alone, together = asyncio.run(main())
    for (_, o1), (d2, o2) in zip(alone, together, strict=True):
        assert o1.outputs[0].token_ids == o2.outputs[0].token_ids
        assert sum(d2, []) == o2.outputs[0].token_ids  # deltas add up to the whole
        assert o2.finished and o2.outputs[0].finish_reason == "length"
    _idle(engine)


def test_abort_mid_stream_frees_blocks(engine):
    async def main():
        await engine.start()
        params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
        agen = engine.generate({"prompt_token_ids": list(range(300, 340))}, params, "ab")
        seen = 0
        async for _ in agen:
            seen += 1
            if seen == 3:
                break
        await agen.aclose()  # what a disconnecting client's handler does
        for _ in range(50):
            if engine.stats()["num_free_blocks"] == engine.stats()["num_total_blocks"]:
                break
            await asyncio.sleep(0.02)

    asyncio.run(main())
    _idle(engine)


def test_failed_step_fails_its_requests_and_loop_goes_on(engine, monkeypatch):
    runner = engine.engine.runner
    real = runner.execute
    calls = {"n": 0}

    def flaky(sched):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated device fault")
        return real(sched)

    monkeypatch.setattr(runner, "execute", flaky)

    async def main():
        await engine.start()
        with pytest.raises(EngineError, match="simulated device fault"):
            await _collect(engine, {"prompt_token_ids": [5, 6, 7, 8]}, GREEDY, "bad")
        _, out = await _collect(engine, {"prompt_token_ids": [9, 10, 11]}, GREEDY, "good")
        return out

    out = asyncio.run(main())
    assert out.finished and len(out.outputs[0].token_ids) == 10
    _idle(engine)


def test_failed_launch_with_async_outputs_still_delivers_the_step_before(tiny_dir,  # noqa: F811
                                                                       monkeypatch):
    """Async output processing: a step's outputs are built after the next launch. When that
    launch fails, its requests fail, and the finished step's outputs still reach their
    streams (StepError.outputs)."""
    cfg = EngineConfig(model=ModelConfig(model=str(tiny_dir), device="cpu"),
                       scheduler=SchedulerConfig(max_num_batched_tokens=256),
                       async_output_proc=True)
    engine = AsyncEngine.from_config(cfg)
    runner = engine.engine.runner
    real = runner.launch
    calls = {"n": 0}

    def flaky(sched):
        calls["n"] += 1
        if calls["n"] == 2:  # the first decode step, after both prefills
            raise RuntimeError("simulated device fault")
        return real(sched)

    monkeypatch.setattr(runner, "launch", flaky)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    async def main():
        await engine.start()
        try:
            return await asyncio.wait_for(asyncio.gather(  # without them, "short" hangs
                _collect(engine, {"prompt_token_ids": [5, 6, 7]}, one, "short"),
                _collect(engine, {"prompt_token_ids": [8, 9, 10]}, GREEDY, "long"),
                return_exceptions=True), timeout=120)
        finally:
            await engine.stop()

    short, long = asyncio.run(main())
    assert isinstance(long, EngineError) and "simulated device fault" in str(long)
    _, out = short
    assert out.finished and len(out.outputs[0].token_ids) == 1
    assert calls["n"] == 2
    _idle(engine)


def test_bad_prompt_raises_before_first_output(engine):
    async def main():
        await engine.start()
        n = engine.max_model_len
        with pytest.raises(ValueError, match="maximum context length"):
            await _collect(engine, {"prompt_token_ids": [1] * (n + 1)}, GREEDY, "long")

    asyncio.run(main())
    _idle(engine)
