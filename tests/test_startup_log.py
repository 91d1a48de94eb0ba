"""Start-up phases named for what ran (the demo model's first-start build apart from the KV
cache, no CUDA phase on a CPU), and the demo's generation_config.json defaults. The log of a
real start is checked in ``test_first_hour_e2e.py``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from edge_llm.model.demo import DEMO_GENERATION, write_generation_defaults
from edge_llm.server.hooks import StartupPhases


def fake_engine(device: str, demo_seconds: float) -> SimpleNamespace:
    startup = {"demo_build_seconds": demo_seconds, "weight_load_seconds": 2.0,
               "weight_bytes": int(1e9), "kernel_warmup_seconds": 0.0, "device": device}
    return SimpleNamespace(stats=lambda: {"startup": startup})


@pytest.mark.parametrize(("device", "demo_seconds"), [("cpu", 150.0), ("cpu", 0.0),
                                                       ("cuda", 0.0)])
def test_phases_name_what_ran(device, demo_seconds, caplog):
    phases = StartupPhases()
    with caplog.at_level("INFO", logger="edge_llm.server"):
        phases.record_engine(fake_engine(device, demo_seconds), 160.0)
    assert phases.seconds["weight_load"] == 2.0
    assert phases.seconds["kv_allocation"] == pytest.approx(160.0 - demo_seconds - 2.0)
    assert ("demo_build" in phases.seconds) == bool(demo_seconds)
    if demo_seconds:
        assert phases.seconds["demo_build"] == demo_seconds
        assert "startup phase demo_build: 150.00 s (first start only: fetched the GGUF" in \
            caplog.text
    assert ("CUDA context" in caplog.text) == (device == "cuda")


def test_demo_generation_defaults_are_written_once(tmp_path):
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2, "temperature": 1.0}))
    write_generation_defaults(tmp_path)
    written = json.loads(path.read_text())
    assert written == {"bos_token_id": 1, "eos_token_id": 2, **DEMO_GENERATION}
    assert DEMO_GENERATION == {"do_sample": True, "temperature": 0.2, "top_p": 0.9}
    stamp = path.stat().st_mtime_ns
    write_generation_defaults(tmp_path)  # already there: left alone
    assert path.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == ["generation_config.json"]


class _SlowEngine:
    model_name = "slow"

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def stats(self) -> dict:
        return {}


@pytest.mark.anyio
async def test_holder_says_not_ready_while_loading(caplog):
    import asyncio
    import time

    from edge_llm.server.lifecycle import EngineHolder

    holder = EngineHolder(lambda: time.sleep(0.5) or _SlowEngine(), ready_timeout=10,
                          max_num_seqs=1, max_queue=None)
    holder.notice_every_s = 0.1
    with caplog.at_level("INFO", logger="edge_llm.server"):
        await holder.start_loading()
        await holder.wait_ready()
        notices = caplog.text.count("Still loading, NOT READY")
        await asyncio.sleep(0.3)  # ready: no more notices
        assert caplog.text.count("Still loading, NOT READY") == notices >= 2
        assert "READY: model slow answers requests" in caplog.text
        await holder.shutdown()
