"""edge-llm: 4-bit GPTQ/AWQ LLMs on one consumer GPU behind an OpenAI-compatible API."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import envs
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams, StructuredOutputsParams

# OpenMP threads that spin while waiting make every small CPU op crawl as soon as another
# process wants the cores (BENCHMARKS.md, "CPU"). Takes effect when edge_llm is imported
# before torch (none of the imports above loads it); the user's own setting wins.
envs.set_default(envs.OMP_WAIT_POLICY, "PASSIVE")

__version__ = "0.1.0"
__all__ = ["LLM", "AsyncEngine", "SamplingParams", "StructuredOutputsParams", "RequestOutput",
           "CompletionOutput"]

if TYPE_CHECKING:
    from .engine.async_engine import AsyncEngine
    from .engine.llm import LLM


def __getattr__(name: str):
    # torch and transformers load only when the engine is asked for
    if name == "LLM":
        from .engine.llm import LLM

        return LLM
    if name == "AsyncEngine":
        from .engine.async_engine import AsyncEngine

        return AsyncEngine
    raise AttributeError(name)
