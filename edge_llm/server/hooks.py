"""Scale-to-zero settings and the pieces the server's lifecycle calls: start-up phase timing,
warm-up passes, user hooks and the persistent compile caches.

    process start -> import -> [demo_build] -> weight_load -> kv_allocation -> kernel_warmup
                  -> cuda_graphs -> [on_load] -> warmup -> ready [on_ready] -> (idle) sleep
                  -> [on_sleep] -> wake_up [on_wake] -> ...
                  [cuda_context]: on a thread of its own, beside import (engine/device_prep.py)

(``demo_build``: the first start of the built-in demo model fetches its GGUF source and
quantizes it; later starts find it in the cache. ``kernel_warmup``: the Triton kernels a
prefill needs, compiled or loaded from the cache directory.)

A user hook is ``module:function``; it is called as ``function(event, state)`` with ``event``
one of ``HOOK_EVENTS`` and ``state`` the Litestar app state (``state.ctx`` is the server's
``ServerContext``); it may be a coroutine function. A hook that raises during ``on_load`` fails
the start-up (health reports it); at the other events the error is logged and ignored.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_llm import envs

from .engine_api import ServingEngine

if TYPE_CHECKING:
    from edge_llm.sampling_params import SamplingParams

logger = logging.getLogger("edge_llm.server")

HOOK_EVENTS = ("on_load", "on_ready", "on_sleep", "on_wake")
# start-up phases in order; "ready" is seconds from process start to ready
PHASES = ("import", "cuda_context", "demo_build", "weight_load", "kv_allocation",
          "kernel_warmup", "cuda_graphs", "warmup", "ready")
WARMUP_PROMPT = "Warm-up: list three colours, then count from one to ten."


@dataclass(frozen=True)
class LifecycleConfig:
    """Settings of the server's life (``edge-llm serve`` flags of the same names).

    ``idle_sleep_s``: sleep the engine after that many seconds without requests (None: never).
    ``warmup``: run the built-in warm-up pass before ready. ``warmup_prompts``: requests read
    by ``read_warmup_prompts`` (run before ready). ``hooks``: ``module:function`` entry points.
    ``drain_timeout``: seconds in-flight requests get to finish after SIGTERM.
    ``sagemaker``: also serve ``POST /invocations``.
    ``freeze_gc``: the cyclic GC is off while the model loads (the imports, loading and
    warm-up create some 300,000 objects, and the passes they set off only walk them: 0.17 s
    of the CPU's 1.45 s import of torch and the server), then, once ready, ``gc.collect()``,
    ``gc.freeze()`` (as vLLM's server does) and the GC back on (also after a failed load).
    The start-up objects (model, tokenizer, compiled kernels: about 190,000 with the demo
    model) then leave the cyclic GC's full passes, which otherwise make output processing at
    a few hundred streamed rows about three times slower. ``edge-llm serve`` turns it on. It
    is off by default because a process that builds many engines (the tests) would keep any
    cycle among frozen objects forever.
    """

    idle_sleep_s: float | None = None
    sleep_level: int = 1
    warmup: bool = True
    warmup_prompts: tuple[dict[str, Any], ...] = ()
    hooks: tuple[str, ...] = ()
    drain_timeout: float = 30.0
    sagemaker: bool = False
    warmup_batch: int = 4  # sequences of the larger warm-up batch (capped by max_num_seqs)
    warmup_tokens: int = 3  # decode steps per warm-up request
    freeze_gc: bool = False

    def __post_init__(self) -> None:
        if self.idle_sleep_s is not None and self.idle_sleep_s <= 0:
            raise ValueError(f"idle_sleep_s must be > 0 seconds, got {self.idle_sleep_s}.")
        if self.sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 or 2, got {self.sleep_level}.")
        if self.drain_timeout < 0:
            raise ValueError(f"drain_timeout must be >= 0 seconds, got {self.drain_timeout}.")
        if self.warmup_batch < 1 or self.warmup_tokens < 1:
            raise ValueError("warmup_batch and warmup_tokens must be >= 1.")
        for spec in self.hooks:
            parse_hook_spec(spec)


# ---- persistent compile caches ------------------------------------------------------------


def set_compile_cache_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Point Triton's kernel/autotune cache and TorchInductor's cache under the edge-llm cache
    dir, unless the user set them; returns the variables it set. Call before torch loads."""
    root = envs.CACHE_DIR.get(environ)
    wanted = {envs.TRITON_CACHE_DIR: root / "triton",
              envs.TORCHINDUCTOR_CACHE_DIR: root / "inductor"}
    return {var.name: str(path) for var, path in wanted.items()
            if envs.set_default(var, str(path), environ)}


# ---- user hooks -----------------------------------------------------------------------------


def parse_hook_spec(spec: str) -> tuple[str, str]:
    """``"pkg.module:function"`` -> (module, function); ValueError naming the spec."""
    module, sep, func = spec.partition(":")
    if not sep or not module.strip() or not func.strip().isidentifier():
        raise ValueError(f"hook must look like 'module:function', got {spec!r}.")
    return module.strip(), func.strip()


def load_hook(spec: str) -> Callable[..., Any]:
    """Import the hook; ValueError naming the spec if the module or function is missing."""
    module_name, func_name = parse_hook_spec(spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"hook {spec!r}: cannot import {module_name!r}: {exc}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"hook {spec!r}: {module_name} has no function {func_name!r}.")
    return func


@dataclass
class Hooks:
    """The user's hooks, called in order at each event with ``(event, state)``."""

    funcs: list[Callable[..., Any]] = field(default_factory=list)
    state: Any = None  # the app state, set once the app exists

    @classmethod
    def from_specs(cls, specs: tuple[str, ...]) -> Hooks:
        return cls([load_hook(s) for s in specs])

    async def fire(self, event: str, *, strict: bool = False) -> None:
        """Call every hook; ``strict``: let an exception through, else log it."""
        assert event in HOOK_EVENTS, event
        for func in self.funcs:
            try:
                result = func(event, self.state)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                if strict:
                    raise
                logger.exception("Hook %s failed at %s", getattr(func, "__name__", func), event)


# ---- warm-up ------------------------------------------------------------------------------


def read_warmup_prompts(path: str | Path) -> tuple[dict[str, Any], ...]:
    """Warm-up requests from a file: JSONL of OpenAI bodies (a body with ``messages`` is a chat
    request, one with ``prompt`` a completion) or plain text, one prompt per line (each becomes
    a completion body). Blank lines are skipped. ValueError naming the file and line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"warm-up prompts file {path}: {exc.strerror or exc}") from None
    bodies = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        if text.startswith("{"):
            try:
                body = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: invalid JSON: {exc.msg}") from None
            if not isinstance(body, dict) or ("messages" in body) == ("prompt" in body):
                raise ValueError(f"{path}:{number}: a body needs 'messages' or 'prompt'.")
        else:
            body = {"prompt": line, "max_tokens": 8}
        bodies.append(body)
    if not bodies:
        raise ValueError(f"warm-up prompts file {path} has no prompts.")
    return tuple(bodies)


async def _drain(engine: ServingEngine, prompt_ids: list[int], params: SamplingParams) -> int:
    """Run one request to its end; the number of tokens generated."""
    count = 0
    async for out in engine.generate(prompt_ids, params, f"warmup-{uuid.uuid4().hex[:12]}"):
        count = sum(len(c.token_ids) for c in out.outputs)
    return count


async def builtin_warmup(engine: ServingEngine, config: LifecycleConfig, max_num_seqs: int) -> int:
    """Prefill + ``warmup_tokens`` decode steps at batch 1, then at a larger batch (greedy,
    EOS ignored, so every step runs). Returns the tokens generated."""
    from edge_llm.sampling_params import SamplingParams

    ids = engine.tokenizer.encode(WARMUP_PROMPT)
    params = SamplingParams(max_tokens=config.warmup_tokens, temperature=0.0, ignore_eos=True)
    total = await _drain(engine, ids, params)
    batch = min(config.warmup_batch, max_num_seqs)
    if batch > 1:
        # distinct prompts so that the prefix cache does not turn the prefills into copies
        prompts = [engine.tokenizer.encode(f"{i}. {WARMUP_PROMPT}") for i in range(batch)]
        counts = await asyncio.gather(*(_drain(engine, p, params) for p in prompts))
        total += sum(counts)
    return total


async def user_warmup(engine: ServingEngine, bodies: tuple[dict[str, Any], ...],
                      chat_template: str | None) -> int:
    """Run the user's warm-up bodies through the same preprocessing as the routes (all at
    once, like a burst of requests); returns the tokens generated. Raises on a bad body."""
    import msgspec

    from .preprocess import chat_inputs, completion_inputs
    from .protocol import ChatCompletionRequest, CompletionRequest

    runs = []
    for body in bodies:
        if "messages" in body:
            req = msgspec.convert(body, ChatCompletionRequest)
            prompt, params = chat_inputs(req, engine, chat_template)
            runs.append(_drain(engine, prompt.token_ids, params))
        else:
            creq = msgspec.convert(body, CompletionRequest)
            prompts, plist = completion_inputs(creq, engine)
            pairs = zip(prompts, plist, strict=True)
            runs.extend(_drain(engine, p.token_ids, sp) for p, sp in pairs)
    return sum(await asyncio.gather(*runs))


# ---- start-up phases ----------------------------------------------------------------------


def process_start_time() -> float:
    """This process's start as a ``time.time()`` value (Linux /proc; else now)."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_after_boot = int(fields[19]) / ticks  # field 22 (starttime) of proc(5)
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + started_after_boot
    except (OSError, ValueError, IndexError):
        return time.time()


@dataclass
class StartupPhases:
    """Seconds per start-up phase (``PHASES``); each is logged as it is recorded."""

    seconds: dict[str, float] = field(default_factory=dict)
    process_start: float = field(default_factory=process_start_time)

    def record(self, phase: str, seconds: float, detail: str = "") -> None:
        assert phase in PHASES, phase
        self.seconds[phase] = seconds
        logger.info("startup phase %s: %.2f s%s", phase, seconds, f" ({detail})" if detail else "")

    def record_engine(self, engine: ServingEngine, construct_seconds: float) -> None:
        """Split the engine's construction into the demo model's first-start build (when it
        happened), weight loading (the loader's own figure), the kernel warm-up (CUDA), the
        CUDA graph capture (when graphs were captured) and the rest (tokenizer, KV cache
        allocation; on CUDA also the memory probes and any wait for the context), all read
        from ``engine.stats()`` (its ``startup`` figures); an engine whose stats have none (a
        test double) records the whole as weight_load."""
        stats = engine.stats()
        figures = stats.get("startup")
        if figures is None:
            self.record("weight_load", construct_seconds)
            return
        demo_s = figures["demo_build_seconds"]
        if demo_s:
            self.record("demo_build", demo_s, "first start only: fetched the GGUF source and "
                        "quantized it to 4-bit AWQ; cached for later starts")
        load_s, gb = figures["weight_load_seconds"], figures["weight_bytes"] / 1e9
        self.record("weight_load", load_s, f"{gb:.2f} GB at {gb / max(load_s, 1e-9):.2f} GB/s")
        graphs_s = float(stats.get("cuda_graph_capture_seconds") or 0.0)
        kernels_s = figures["kernel_warmup_seconds"]
        on_cuda = figures["device"] == "cuda"
        what = ("tokenizer, memory probes, KV cache and any wait for the CUDA context"
                if on_cuda else "tokenizer and KV cache")
        self.record("kv_allocation",
                    max(construct_seconds - demo_s - load_s - kernels_s - graphs_s, 0.0), what)
        if kernels_s:
            self.record("kernel_warmup", kernels_s, "Triton kernels of every prefill size, "
                        "compiled or loaded from the cache directory")
        if stats.get("num_cuda_graphs"):
            mib = stats.get("cuda_graph_memory_bytes", 0) / (1 << 20)
            self.record("cuda_graphs", graphs_s,
                        f"{stats['num_cuda_graphs']} decode graphs, {mib:.0f} MiB")

    def record_device_prep(self, result: Any) -> None:
        """The CUDA context made beside the imports (a ``device_prep.PrepResult``), when it
        was: ``cuda_context``, which overlaps ``import``."""
        if result.context_seconds is not None:
            how = "read from the cache folder" if result.triton_key_stored else "hashed"
            key = (f"; Triton's key {how} in {result.triton_key_seconds:.2f} s"
                   if result.triton_key_seconds is not None else "")
            self.record("cuda_context", result.context_seconds,
                        f"on a thread beside the imports{key}")

    def record_ready(self) -> None:
        self.record("ready", time.time() - self.process_start, "since process start")
