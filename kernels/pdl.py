"""Programmatic dependent launch (PDL; Hopper and later): a kernel may be scheduled while the
kernel before it in the stream is still finishing, and waits on the device for its results.

Every Triton kernel of ours starts with ``pdl_enter(PDL)``: with ``PDL`` set it waits there
(``griddepcontrol.wait``: the previous grid has completed and its writes are visible) before
any global load or store, then lets its own dependents launch. Launched with ``launch_pdl``
the kernel's launch latency and set-up overlap the previous kernel's tail instead of
following it; the wait keeps every read after the write it depends on, and as each kernel
waits for the one before it, for every earlier one too. ``pdl_kwargs(device)`` gives a
launch both switches together (a kernel launched with ``launch_pdl`` but no wait would race).

On when ``EDGE_LLM_PDL=1`` and the device is sm_90 or later (sm_8x has no griddepcontrol:
the 3090 / 4090 path is unchanged); off by default until measured end to end.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .device import compute_capability

ENV = "EDGE_LLM_PDL"


@functools.cache
def pdl_wanted() -> bool:
    """``EDGE_LLM_PDL`` is 1 (read once; tests clear the cache); any value but 0 or 1 is an
    error."""
    value = os.environ.get(ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{ENV} must be 0 or 1, got {value!r}.")
    return value == "1"


def pdl_on(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with PDL: asked for, and a CUDA sm_90+ device."""
    return device.type == "cuda" and pdl_wanted() and compute_capability(device)[0] >= 9


def pdl_kwargs(device: torch.device) -> dict:
    """The launch keywords of a kernel on ``device``: its ``PDL`` constexpr and ``launch_pdl``,
    both on or both off."""
    on = pdl_on(device)
    return {"PDL": on, "launch_pdl": on}


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """A kernel's first statement: with ``PDL``, wait for the previous grid, then let the
    next one launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
