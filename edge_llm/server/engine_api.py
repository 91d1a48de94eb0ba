"""``ServingEngine``: what the server uses of the engine, and nothing more.

``edge_llm.engine.async_engine.AsyncEngine`` implements it; so do the HTTP-layer tests' fakes
(tests/test_server_fake_engine.py). The server imports no engine module at start-up (torch
loads with the engine, off the event loop: app.py), so the engine's types appear here only
for type checkers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edge_llm.outputs import RequestOutput
from edge_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from edge_llm.engine.structured_output import GrammarCompiler


class ServingEngine(Protocol):
    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (transformers' interface: encode, decode, len, vocab,
        chat_template, apply_chat_template)."""

    @property
    def model_name(self) -> str:
        """The model's own name (``served_model_name`` overrides it in responses)."""

    @property
    def max_model_len(self) -> int:
        """Prompt plus output tokens, at most."""

    @property
    def model_path(self) -> Path | None:
        """The checkpoint folder (its generation_config.json, tokenizer files); None: none."""

    @property
    def grammars(self) -> GrammarCompiler | None:
        """Compiles structured-output constraints (a refusal is a 400 naming the request's
        field); None: the engine does not constrain outputs."""

    async def start(self) -> None:
        """Start serving in the running event loop."""

    async def stop(self) -> None: ...

    def generate(self, prompt: list[int], params: SamplingParams,
                 request_id: str) -> AsyncIterator[RequestOutput]:
        """The outputs of one request as they come; ValueError before the first for bad
        input. Closing the iterator early aborts the request."""

    async def abort(self, request_id: str) -> None: ...

    def interrupt_all(self, make_error: Callable[[], Exception]) -> int:
        """End every running ``generate`` with ``make_error()``; returns how many."""

    async def sleep(self, level: int = 1) -> None:
        """Free the GPU; ValueError while requests are in flight."""

    async def wake_up(self) -> None: ...

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The prompt text of ``messages`` by the model's chat template."""

    def stats(self) -> dict[str, Any]:
        """Counters read by /metrics (engine/llm_engine.py ``LLMEngine.stats``)."""
