"""Flags that also read ``EDGE_LLM_*`` environment variables: ``Option``, the value parsers,
the ``edge-llm serve`` flag table (``SERVE_OPTIONS``, which recipes reuse), and how they are
added to a parser and resolved (a flag wins over its environment variable, which wins over
the default)."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from edge_llm.config import DEFAULT_MAX_TOKENS


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


def parse_str_list(text: str) -> tuple[str, ...]:
    """A JSON list (vLLM's form, ``'["http://a.com"]'``) or comma-separated values."""
    text = text.strip()
    if text.startswith("["):
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"expected a JSON list of strings, got {text!r}: {exc.msg}"
                             ) from None
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"expected a JSON list of strings, got {text!r}")
    else:
        values = text.split(",")
    return tuple(v.strip() for v in values if v.strip())


def _count(text: str, least: int, expected: str) -> int:
    """``text`` as an integer >= ``least``; anything else a ValueError saying ``expected``."""
    try:
        value = int(text.strip())
    except ValueError:
        value = least - 1
    if value < least:
        raise ValueError(f"expected {expected}, got {text!r}")
    return value


def parse_limit(text: str) -> int | None:
    """A count >= 1, or ``none`` (no limit)."""
    if text.strip().lower() == "none":
        return None
    return _count(text, 1, "a count >= 1 or none")


def parse_token_cap(text: str) -> int | str:
    """``auto``, a token count, or ``0`` / ``none`` (no cap: 0)."""
    low = text.strip().lower()
    if low == "auto":
        return "auto"
    if low == "none":
        return 0
    return _count(text, 0, "auto, none or a token count >= 0")


def parse_max_tokens(text: str) -> int:
    """A token count >= 0; ``none`` is 0 (no bound)."""
    if text.strip().lower() == "none":
        return 0
    return _count(text, 0, "a token count >= 0 or none")


# argparse names a parser in its error ("invalid <name> value: 'x'")
parse_int_list.__name__ = "integer list"
parse_bytes.__name__ = "size"
parse_token_cap.__name__ = "token count"
parse_str_list.__name__ = "list"
parse_limit.__name__ = "limit"
parse_max_tokens.__name__ = "token count"


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
           "--gpu-memory-utilization (default: sized by --gpu-memory-utilization)"),
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
    Option("--chat-template", str, None, "a Jinja chat template file overriding the model's "
           "(default: the tokenizer's own)"),
    Option("--tool-call-parser", str, "auto", "how tool_choice auto reads tool calls out of "
           "replies: auto (from the chat template), hermes, llama3_json or none"),
    Option("--reasoning-parser", str, "auto", "<think> reasoning -> reasoning_content: auto "
           "(when the chat template has </think>), deepseek_r1, qwen3 or none"),
    Option("--served-model-name", str, None, "model name in the API (default: the model's)"),
    Option("--default-max-tokens", parse_max_tokens, None, "most tokens a chat completion "
           "generates when the request sends no max_tokens / max_completion_tokens (default: "
           f"the model's generation_config.json max_new_tokens, else {DEFAULT_MAX_TOKENS}; "
           "0 or none: the rest of the context, as vLLM; /v1/completions keeps OpenAI's 16)"),
    Option("--generation-config", str, "auto", "default sampling settings for fields a request "
           "leaves out, as vLLM: auto (the model's generation_config.json: temperature, top_p, "
           "top_k, min_p, repetition_penalty, max_new_tokens), vllm (ignore it: vLLM's "
           "defaults) or a folder holding a generation_config.json"),
    Option("--api-key", str, None, "require 'Authorization: Bearer KEY' on /v1, the tokenizer "
           "routes and the sleep routes (default: no key)"),
    Option("--max-queue", int, None, "sequences (prompts times n) that may wait beyond "
           "--max-num-seqs; a request that would pass it gets 429 (default: no limit)"),
    Option("--ready-timeout", float, 600.0, "seconds a request waits for the model to load"),
    Option("--log-level", str, "info", "debug, info, warning or error"),
    _bool_flag("--log-requests", True, "one log line per request"),
    Option("--idle-sleep-s", float, None, "sleep the engine after this many idle seconds "
           "(default: never); the next request wakes it"),
    Option("--sleep-level", int, 1, "1: weights to host memory while asleep, 2: dropped"),
    _bool_flag("--warmup", True, "run a prefill/decode warm-up pass before ready"),
    Option("--warmup-prompts", str, None, "file of warm-up requests run before ready: one "
           "prompt per line, or JSONL of OpenAI bodies (default: none)"),
    Option("--hook", str, None, "lifecycle hook(s) 'module:function', comma-separated; called "
           "with (event, app state) at on_load/on_ready/on_sleep/on_wake (default: none)"),
    Option("--drain-timeout", float, 30.0, "seconds in-flight requests get after SIGTERM"),
    Option("--allowed-origins", parse_str_list, (), "origins that may call the API from a "
           "browser (CORS), as a JSON list or comma-separated; '*' for any (default: none, "
           "no CORS headers, and POSTs from other origins are refused)"),
    Option("--allowed-methods", parse_str_list, ("*",), "CORS: methods allowed from "
           "--allowed-origins"),
    Option("--allowed-headers", parse_str_list, ("*",), "CORS: request headers allowed from "
           "--allowed-origins"),
    _bool_flag("--allow-credentials", False, "CORS: allow credentials (cookies, "
               "Authorization) from --allowed-origins"),
    Option("--allowed-hosts", parse_str_list, (), "Host header values accepted when bound "
           "to a loopback address, beyond the loopback names (the DNS-rebinding defence); '*' "
           "for any, e.g. behind a local reverse proxy that passes the public Host"),
    _bool_flag("--enable-sleep-endpoints", False, "serve POST /sleep, POST /wake_up and GET "
               "/is_sleeping (protected by --api-key when set); --idle-sleep-s works "
               "without them"),
    Option("--max-prompts-per-request", parse_limit, 256, "prompts one completions request "
           "may hold (none: no limit)"),
    Option("--max-messages", parse_limit, 1024, "messages one chat request may hold (none: no "
           "limit)"),
    Option("--max-prompt-chars", parse_limit, 1_000_000, "characters of prompt text one "
           "request may hold (all its prompts or messages), checked before tokenizing (none: "
           "no limit)"),
    Option("--header-read-timeout", float, 15.0, "seconds a client gets to send a request's "
           "headers before the connection is closed"),
    Option("--body-read-timeout", float, 60.0, "seconds a client gets to send a request's "
           "whole body (408 after that)"),
    Option("--timeout-keep-alive", float, 5.0, "seconds an idle kept-alive connection stays "
           "open"),
    _bool_flag("--sagemaker", False, "SageMaker mode: POST /invocations, port 8080 (also on "
               "when $SAGEMAKER_BIND_TO_PORT or $SM_MODEL_DIR is set)"),
)


def option_env(flag: str, environ: dict[str, str] | None = None) -> str | None:
    """The text of the first set environment variable of serve option ``flag`` (None: none)."""
    environ = os.environ if environ is None else environ
    (opt,) = (o for o in SERVE_OPTIONS if o.flag == flag)
    return next((environ[n] for n in opt.envs if environ.get(n)), None)


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    for opt in options:
        envs = " or ".join("$" + e for e in opt.envs)
        # a default of None is described in the help text itself ("default: the model's")
        default = "" if opt.default is None else f"; default {_shown(opt.default)}"
        text = f"{opt.help} [env {envs}{default}]"
        if opt.type is parse_bool:
            parser.add_argument(opt.flag, action=argparse.BooleanOptionalAction, default=None,
                                help=text)
        else:
            parser.add_argument(opt.flag, type=opt.type, default=None, help=text,
                                metavar=opt.dest.upper())


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def environment_help(options: Sequence[Option]) -> str:
    """The environment variables of ``options``, one line each, for a help epilog."""
    lines = []
    for opt in options:
        lines.append(f"  {' or '.join(opt.envs):<44} {opt.flag}")
    return "\n".join(lines)


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
