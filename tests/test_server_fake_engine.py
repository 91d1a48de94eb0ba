"""The fake engine and helpers for the HTTP-layer unit tests (``test_server_unit*.py``).

The fake implements AsyncEngine's API over the real SmolLM2 tokenizer: each choice replays a
random token script (fresh per test; fixture ``token_scripts`` in conftest.py), so texts,
deltas, logprobs and finish reasons are real tokenizer output, without loading a model. This
module holds no tests.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from edge_llm.config import EngineConfig, SchedulerConfig, ServerConfig
from edge_llm.engine.tokenizer import apply_chat_template
from edge_llm.outputs import CompletionOutput, RequestOutput
from edge_llm.server import create_app

TOKENIZER_DIR = Path("/tmp/smol/hf")
# Litestar's test client sends Host: testserver.local, which a loopback-bound server refuses
TEST_CLIENT_HOSTS = ("testserver.local",)


def load_tokenizer():
    from transformers import AutoTokenizer

    src = TOKENIZER_DIR
    if not (src / "tokenizer.json").is_file():
        from edge_llm.model.demo import ensure_demo_model

        src = ensure_demo_model()
    return AutoTokenizer.from_pretrained(str(src))


class FakeEngine:
    """The server's engine protocol (server/engine_api.py) but for sleep: choice i of a
    request replays ``script[i]`` (token ids); it has no model folder and constrains
    nothing."""

    model_name = "fake-model"
    model_path: Path | None = None
    grammars = None

    def __init__(self, tokenizer, scripts: list[list[int]], max_model_len: int = 256,
                 step_delay: float = 0.0, total_blocks: int = 64) -> None:
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.max_model_len = max_model_len
        self.step_delay = step_delay
        self.total_blocks = total_blocks
        self.active: dict[str, int] = {}  # request id -> blocks held
        self.aborted: list[str] = []
        self.requests: list[tuple[list[int], object]] = []
        self.fail_at_step: int | None = None
        self.started = False
        self.interrupt = None  # interrupt_all's error maker: ends every running generate

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.active.pop(request_id, None)

    def interrupt_all(self, make_error) -> int:
        self.interrupt = make_error
        return len(self.active)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, **kw) -> str:
        return apply_chat_template(self.tokenizer, messages, add_generation_prompt, **kw)

    def stats(self) -> dict:
        used = sum(self.active.values())
        return dict(num_requests_running=len(self.active), num_requests_waiting=0,
                    num_requests_swapped=0, kv_cache_usage=used / self.total_blocks,
                    prefix_cache_queries=10, prefix_cache_hits=4, num_preemptions=0,
                    num_free_blocks=self.total_blocks - used, num_total_blocks=self.total_blocks)

    async def generate(self, prompt, params, request_id):
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"This model's maximum context length is {self.max_model_len} "
                             f"tokens, but the prompt has {len(prompt)} tokens.")
        if params.n > 8:  # as the real engine refuses n > max_num_seqs
            raise ValueError(f"n={params.n} exceeds max_num_seqs=8.")
        self.requests.append((list(prompt), params))
        self.active[request_id] = 1 + len(prompt) // 16
        outs = [CompletionOutput(i, "", [], logprobs=[] if params.logprobs is not None else None)
                for i in range(params.n)]
        try:
            for step in range(params.max_tokens):
                await asyncio.sleep(self.step_delay)
                if self.fail_at_step == step:
                    raise RuntimeError("simulated engine failure")
                if self.interrupt is not None:
                    raise self.interrupt()
                for o in outs:
                    self._advance(o, params, step)
                yield RequestOutput(request_id, None, list(prompt),
                                    [_snapshot(o) for o in outs],
                                    all(o.finish_reason for o in outs))
                for o in outs:
                    o.text_delta, o.token_ids_delta, o.logprobs_delta = "", [], None
                if all(o.finish_reason for o in outs):
                    return
        finally:
            self.active.pop(request_id, None)

    def _advance(self, o: CompletionOutput, params, step: int) -> None:
        if o.finish_reason:
            return
        script = self.scripts[o.index % len(self.scripts)]
        tok = script[step % len(script)]
        o.token_ids.append(tok)
        o.token_ids_delta.append(tok)
        text = self.tokenizer.decode(o.token_ids)
        for stop in params.stop:
            if stop in text:
                text, o.finish_reason = text[: text.index(stop)], "stop"
        o.text_delta, o.text = text[len(o.text):], text
        if params.logprobs is not None:
            lps = {tok: -0.25}
            for k in range(params.logprobs):
                lps.setdefault((tok + 1 + k) % len(self.tokenizer), -1.0 - k)
            o.logprobs.append(lps)
            o.logprobs_delta = [lps]
        if not o.finish_reason and len(o.token_ids) >= params.max_tokens:
            o.finish_reason = "length"


def _snapshot(o: CompletionOutput) -> CompletionOutput:
    return CompletionOutput(o.index, o.text, list(o.token_ids), None,
                            list(o.logprobs) if o.logprobs is not None else None,
                            o.finish_reason, None, o.text_delta, list(o.token_ids_delta),
                            o.logprobs_delta)


def make_app(engine, *, max_num_seqs: int = 8, load_delay: float = 0.0, fail_load=None,
             **server_kw):
    def factory():
        import time

        time.sleep(load_delay)
        if fail_load is not None:
            raise fail_load
        return engine

    cfg = EngineConfig(scheduler=SchedulerConfig(max_num_seqs=max_num_seqs))
    server_kw.setdefault("log_requests", False)
    server_kw.setdefault("allowed_hosts", TEST_CLIENT_HOSTS)
    return create_app(cfg, ServerConfig(**server_kw), engine_factory=factory)


def sse_payloads(text: str) -> list:
    """Parse an SSE body strictly: every event is ``data: ...`` followed by a blank line."""
    assert text.endswith("\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


def assert_error(r, status: int, param: str | None = "__any__") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param != "__any__":
        assert err["param"] == param, err
    return err
