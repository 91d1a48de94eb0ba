"""edge-llm: 4-bit GPTQ/AWQ LLMs on one consumer GPU behind an OpenAI-compatible API."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

# OpenMP threads that spin while waiting make every small CPU op crawl as soon as another
# process wants the cores (measured on 2 cores: 1.9 -> 14.4 tokens/s for the demo model).
# Takes effect when edge_llm is imported before torch; the user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .checkout_path import unshadow
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams, StructuredOutputsParams

unshadow()  # a checkout's kernels/ and quant/ must not pass for the `kernels` distribution

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
