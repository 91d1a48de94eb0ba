"""Flags that also read ``EDGE_LLM_*`` environment variables: ``Option``, the value parsers,
the ``edge-llm serve`` flag table (``SERVE_OPTIONS``, which recipes reuse), and how they are
added to a parser and resolved (a flag wins over its environment variable, which wins over
the default)."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class UsageError(Exception):
    """A bad flag or value: one line on stderr, exit code 2."""


@dataclass(frozen=True)
class Option:
    flag: str
    type: Callable[[str], Any]
    default: Any
    help: str
    env: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def envs(self) -> tuple[str, ...]:
        return ("EDGE_LLM_" + self.dest.upper(),) + self.env


def env_on(name: str, default: str) -> bool:
    """An engine switch read from the environment variable ``name``: "1" on, "0" off
    (``default`` where unset); any other value is a ValueError naming it."""
    value = os.environ.get(name, default)
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}.")
    return value == "1"


def parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def parse_int_list(text: str) -> tuple[int, ...]:
    """``1,2,4,8`` -> (1, 2, 4, 8)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    return values


def parse_bytes(text: str) -> int:
    """``4294967296``, ``4GiB``, ``512MB``, ``2g`` -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m:
        raise ValueError(f"expected a size in bytes such as 2GiB, got {text!r}")
    scale = 1024 ** " kmgt".index(m.group(2) or " ")
    return int(float(m.group(1)) * scale)


def parse_token_cap(text: str) -> int | str:
    """``auto``, a token count, or ``0`` / ``none`` (no cap: 0)."""
    low = text.strip().lower()
    if low == "auto":
        return "auto"
    if low == "none":
        return 0
    try:
        value = int(low)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"expected auto, none or a token count >= 0, got {text!r}")
    return value


# argparse names a parser in its error ("invalid <name> value: 'x'")
parse_int_list.__name__ = "integer list"
parse_bytes.__name__ = "size"
parse_token_cap.__name__ = "token count"


def _bool_flag(flag: str, default: bool, help: str) -> Option:
    return Option(flag, parse_bool, default, help)


SERVE_OPTIONS: tuple[Option, ...] = (
    Option("--host", str, "127.0.0.1", "address to bind"),
    Option("--port", int, 8000, "port to bind (also $PORT)", env=("PORT",)),
    Option("--dtype", str, "auto", "activation dtype: auto, float16, bfloat16, float32"),
    Option("--device", str, "auto", "cuda, cuda:N, cpu or auto"),
    Option("--max-model-len", int, None, "context length (default: the model's)"),
    Option("--block-size", int, 16, "KV-cache block size in tokens: 8, 16 or 32"),
    Option("--gpu-memory-utilization", float, 0.9, "fraction of GPU memory to use"),
    Option("--kv-cache-memory", parse_bytes, None, "KV-cache size (e.g. 2GiB); overrides "
           "--gpu-memory-utilization"),
    Option("--swap-space", float, 4.0, "GiB of host memory for swapped-out KV blocks"),
    Option("--kv-cache-dtype", str, "auto", "auto (the activations' dtype) or fp8 (e4m3, "
           "unscaled: half the bytes per token)"),
    _bool_flag("--enable-prefix-caching", True, "reuse KV blocks of shared prompt prefixes"),
    Option("--max-num-seqs", int, 256, "most sequences per step"),
    Option("--max-num-batched-tokens", int, 2048, "most tokens per step"),
    Option("--max-tokens-with-decodes", parse_token_cap, 0, "tokens a step may take while "
           "sequences are decoding, theirs included: a joining prompt is prefilled in chunks "
           "of the rest (auto: the largest short-step CUDA graph, 512, so such steps replay "
           "a graph; 0: no cap beyond --max-num-batched-tokens)"),
    Option("--growth-reserve", int, 128, "admit a request only while the KV cache keeps room "
           "for this many more tokens of every running one (0: off)"),
    Option("--preemption-mode", str, None, "recompute or swap (default: swap only the "
           "sequences of n > 1 requests)"),
    Option("--seed", int, 0, "random seed"),
    _bool_flag("--enforce-eager", False, "no CUDA graphs"),
    Option("--cuda-graph-sizes", parse_int_list, None, "decode batch sizes to capture as "
           "CUDA graphs, e.g. 1,2,4,8,16,32,64,128,256 (default: 13 sizes up to "
           "--max-num-seqs); larger decode steps run eagerly"),
    _bool_flag("--disable-async-output-proc", False, "build a step's outputs before launching "
               "the next one (default on a GPU: while the GPU runs it)"),
    _bool_flag("--disable-decode-run-ahead", False, "launch a decode step only after the one "
               "before it has returned its tokens (default on a GPU: launched before, fed "
               "on the device)"),
    Option("--chat-template", str, None, "a Jinja chat template file overriding the model's"),
    Option("--tool-call-parser", str, "auto", "how tool_choice auto reads tool calls out of "
           "replies: auto (from the chat template), hermes, llama3_json or none"),
    Option("--reasoning-parser", str, "auto", "<think> reasoning -> reasoning_content: auto "
           "(when the chat template has </think>), deepseek_r1, qwen3 or none"),
    Option("--served-model-name", str, None, "model name in the API (default: the model's)"),
    Option("--api-key", str, None, "require 'Authorization: Bearer KEY' on /v1"),
    Option("--max-queue", int, None, "requests that may wait beyond --max-num-seqs; more get "
           "429 (default: no limit)"),
    Option("--ready-timeout", float, 600.0, "seconds a request waits for the model to load"),
    Option("--log-level", str, "info", "debug, info, warning or error"),
    _bool_flag("--log-requests", True, "one log line per request"),
    Option("--idle-sleep-s", float, None, "sleep the engine after this many idle seconds "
           "(default: never); the next request wakes it"),
    Option("--sleep-level", int, 1, "1: weights to host memory while asleep, 2: dropped"),
    _bool_flag("--warmup", True, "run a prefill/decode warm-up pass before ready"),
    Option("--warmup-prompts", str, None, "file of warm-up requests run before ready: one "
           "prompt per line, or JSONL of OpenAI bodies"),
    Option("--hook", str, None, "lifecycle hook(s) 'module:function', comma-separated; called "
           "with (event, app state) at on_load/on_ready/on_sleep/on_wake"),
    Option("--drain-timeout", float, 30.0, "seconds in-flight requests get after SIGTERM"),
    _bool_flag("--sagemaker", False, "SageMaker mode: POST /invocations, port 8080 (also on "
               "when $SAGEMAKER_BIND_TO_PORT or $SM_MODEL_DIR is set)"),
)


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    for opt in options:
        envs = " or ".join("$" + e for e in opt.envs)
        text = f"{opt.help} [env {envs}; default {opt.default}]"
        if opt.type is parse_bool:
            parser.add_argument(opt.flag, action=argparse.BooleanOptionalAction, default=None,
                                help=text)
        else:
            parser.add_argument(opt.flag, type=opt.type, default=None, help=text,
                                metavar=opt.dest.upper())


def resolve_options(args: argparse.Namespace, options: Sequence[Option],
                    environ: dict[str, str] | None = None) -> None:
    """Fill unset flags from the environment, then the defaults (in place)."""
    environ = os.environ if environ is None else environ
    for opt in options:
        if getattr(args, opt.dest, None) is not None:
            continue
        value = opt.default
        for name in opt.envs:
            raw = environ.get(name)
            if raw is not None and raw != "":
                try:
                    value = opt.type(raw)
                except ValueError as exc:
                    raise UsageError(f"environment variable {name}: {exc}") from None
                break
        setattr(args, opt.dest, value)
