"""Programmatic dependent launch (PDL; Hopper and later): a kernel may be scheduled while the
kernel before it in the stream is still finishing, and waits on the device for its results.

Every Triton kernel of ours starts with ``pdl_enter(PDL)``: with ``PDL`` set it waits there
(``griddepcontrol.wait``: the previous grid has completed and its writes are visible) before
any global load or store, then lets its own dependents launch. Launched with ``launch_pdl``
the kernel's launch latency and set-up overlap the previous kernel's tail instead of
following it; the wait keeps every read after the write it depends on, and as each kernel
waits for the one before it, for every earlier one too. ``pdl_kwargs(device)`` gives a
launch both switches together (a kernel launched with ``launch_pdl`` but no wait would race).
The exception: asking L2 for lines the kernel will read (``prefetch_l2``: the keys and values of
decode attention) before the wait. A prefetch changes no value and L2 is where every
multiprocessor's writes land, so any line may be asked for early. Decode attention asks for its
first tile (``paged_decode.PREFETCH_TILES``). To find its lines decode attention also *loads* the
context length and block table early, which is right only because no kernel of a forward writes them
(the engine copies them in before it): Triton's loads are pure inline asm, and the compiler merges
two loads of one address across the wait. Three more kernels read, before their wait, only what
no kernel of a forward writes: the one-row GEMV its first four weight tiles, or one where its
grid is too large for its register ring (``w4a16_gemv.EARLY_ROWS``, ``RING_RESIDENT``), the
rotary + K/V write its slot, position and cos / sin rows (``rotary_kv.EARLY_TABLES``), RMSNorm
its weight (fused.py, rows of one chunk); tests/test_prefetch_compile.py checks that nothing
read there comes from the activations.

The kernels of forwards of at most ``AUTO_MAX_TOKENS`` tokens launch with PDL (the model's
forward says its size through ``forward_tokens``; kernels outside a forward launch without),
on sm_90 and later only (sm_8x has no griddepcontrol: the 3090 / 4090 path is unchanged). It
speeds up decode steps of a few rows, whose kernels are short enough for launch gaps to
matter, and slows down those of 12 rows and more (BENCHMARKS.md, "Kernels"), hence the
cut-off.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .device import compute_capability

AUTO_MAX_TOKENS = 4
_tokens: contextvars.ContextVar[int | None] = contextvars.ContextVar("pdl_tokens", default=None)


@contextlib.contextmanager
def forward_tokens(n: int) -> Iterator[None]:
    """Within it, kernels belong to a forward of ``n`` tokens (``pdl_on`` decides by it)."""
    token = _tokens.set(n)
    try:
        yield
    finally:
        _tokens.reset(token)


def pdl_on(device: torch.device) -> bool:
    """Whether a kernel launched now on ``device`` uses PDL: a CUDA sm_90+ device, inside a
    forward of at most ``AUTO_MAX_TOKENS`` tokens."""
    if device.type != "cuda":
        return False
    n = _tokens.get()
    if n is None or n > AUTO_MAX_TOKENS:
        return False
    return compute_capability(device)[0] >= 9


def pdl_kwargs(device: torch.device) -> dict:
    """The launch keywords of a kernel on ``device``: its ``PDL`` constexpr and ``launch_pdl``,
    both on or both off."""
    on = pdl_on(device)
    return {"PDL": on, "launch_pdl": on}


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
    next one launch. In that order, at most two grids hold multiprocessors at once; letting
    the next one launch before the wait (more grids, all but one waiting) measured 0.62x at one
    row (BENCHMARKS.md, "Kernels")."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
