"""Programmatic dependent launch (PDL; Hopper and later): a kernel may be scheduled while the
kernel before it in the stream is still finishing, and waits on the device for its results.

Every Triton kernel of ours starts with ``pdl_enter(PDL)``: with ``PDL`` set it waits there
(``griddepcontrol.wait``: the previous grid has completed and its writes are visible) before
any global load or store, then lets its own dependents launch. Launched with ``launch_pdl``
the kernel's launch latency and set-up overlap the previous kernel's tail instead of
following it; the wait keeps every read after the write it depends on, and as each kernel
waits for the one before it, for every earlier one too. ``pdl_kwargs(device)`` gives a
launch both switches together (a kernel launched with ``launch_pdl`` but no wait would race).
The exception: asking L2 for lines the kernel will read (``prefetch_l2``: weights, or the
keys and values of decode attention) before the wait. A prefetch changes no value and L2 is
where every multiprocessor's writes land, so any line may be asked for early. Decode
attention asks for its first tile by default (``EDGE_LLM_DECODE_PREFETCH``, 1.007x at batch
1 on the H200); the GEMV only if ``EDGE_LLM_GEMV_PREFETCH`` asks (it lost; ``prefetch_tiles``).
To find its lines decode attention also *loads* the context length and block table early,
which is right only because no kernel of a forward writes them (the engine copies them in
before it): Triton's loads are pure inline asm, and the compiler merges two loads of one
address across the wait.

``EDGE_LLM_PDL``: ``auto`` (the default) launches with PDL the kernels of forwards of at most
``AUTO_MAX_TOKENS`` tokens (the model's forward says its size through ``forward_tokens``;
kernels outside a forward launch without); ``1`` every kernel; ``0`` none. Only on sm_90 and
later (sm_8x has no griddepcontrol: the 3090 / 4090 path is unchanged). Measured on the H200
(BENCHMARKS.md, session 27): decode steps 1.06x / 1.04x / 1.02x faster at 1 / 2 / 4 rows,
0.99x at 8, 0.95x / 0.94x at 12 / 16 rows, hence the cut-off.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Iterator

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .device import compute_capability

ENV = "EDGE_LLM_PDL"
MODES = ("auto", "0", "1")
AUTO_MAX_TOKENS = 4
_tokens: contextvars.ContextVar[int | None] = contextvars.ContextVar("pdl_tokens", default=None)


@functools.cache
def pdl_mode() -> str:
    """``EDGE_LLM_PDL``: auto, 0 or 1 (read once; tests clear the cache); any other value is
    an error."""
    value = os.environ.get(ENV, "auto")
    if value not in MODES:
        raise ValueError(f"{ENV} must be auto, 0 or 1, got {value!r}.")
    return value


@contextlib.contextmanager
def forward_tokens(n: int) -> Iterator[None]:
    """Within it, kernels belong to a forward of ``n`` tokens (``auto`` decides by it)."""
    token = _tokens.set(n)
    try:
        yield
    finally:
        _tokens.reset(token)


def pdl_on(device: torch.device) -> bool:
    """Whether a kernel launched now on ``device`` uses PDL: a CUDA sm_90+ device, and the
    mode is 1, or auto inside a forward of at most ``AUTO_MAX_TOKENS`` tokens."""
    if device.type != "cuda":
        return False
    mode = pdl_mode()
    if mode == "0":
        return False
    if mode == "auto":
        n = _tokens.get()
        if n is None or n > AUTO_MAX_TOKENS:
            return False
    return compute_capability(device)[0] >= 9


def pdl_kwargs(device: torch.device) -> dict:
    """The launch keywords of a kernel on ``device``: its ``PDL`` constexpr and ``launch_pdl``,
    both on or both off."""
    on = pdl_on(device)
    return {"PDL": on, "launch_pdl": on}


@functools.cache
def prefetch_tiles(env: str, default: int = 0) -> int:
    """A kernel's early L2 prefetch setting ``env`` (``EDGE_LLM_GEMV_PREFETCH``,
    ``EDGE_LLM_DECODE_PREFETCH``): how many of its first tiles each program asks L2 for
    before its wait (0: none; a power of two), ``default`` where unset. Read once; tests
    clear the cache."""
    text = os.environ.get(env, str(default))
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0 or value & (value - 1):
        raise ValueError(f"{env} must be 0 or a power of two (tiles), got {text!r}")
    return value


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the 128-byte lines at ``ptrs`` (PTX only; nothing waits for them). Any
    kernel may do this before its wait: a prefetch changes no value it reads, and L2 is
    where every multiprocessor's reads and writes meet, so a line fetched early is never
    stale."""
    tl.inline_asm_elementwise("mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """A kernel's first statement: with ``PDL``, wait for the previous grid, then let the
    next one launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
