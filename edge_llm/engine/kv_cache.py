"""KV cache tensors: sizing from a memory budget, allocation, swaps and block copies.

Per layer: k and v of shape (num_blocks, block_size, num_kv_heads, head_dim), allocated once,
token-major for every dtype. The CPU swap space mirrors that layout in host memory (pinned on
CUDA).
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from edge_llm import envs
from edge_llm.config import CacheConfig
from edge_llm.kernels.kv_fp8 import KV_FP8
from edge_llm.model.arch import ArchConfig

logger = logging.getLogger(__name__)
GiB = 1 << 30
# what serving reserves beyond the start-up profile's one forward: the sampler's and the
# step metadata's small tensors (the allocator holds those in 2 MiB segments) and blocks
# cached between steps of other sizes. Sized so that serving's peak reserved memory stays
# inside the gpu_memory_utilization budget with expandable segments on (the end-to-end
# benchmark's 24 GB card scenario checks it per shape: Gemma 2 9B, with its 256k vocabulary,
# needed 176 MiB; BENCHMARKS.md "Memory")
SERVING_SLACK_BYTES = 256 << 20
CPU_DEFAULT_KV_BYTES = 2 * GiB  # CPU has no card to take a fraction of; like vLLM's CPU default


def use_expandable_segments(device: torch.device) -> bool:
    """Switch the CUDA caching allocator to expandable segments, before the model loads.

    Without them, steps of other token counts than the start-up profile's split the cached
    blocks of the dequantize path's large matmul outputs, and serving reserves new segments
    beyond the plan, past the memory budget; with them it stays inside.
    The KV tensors are still allocated as plain segments (``plain_segments``).
    Left as it is when the user configured the allocator (``PYTORCH_CUDA_ALLOC_CONF`` or
    ``PYTORCH_ALLOC_CONF``, e.g. ``expandable_segments:False`` for the default allocator).
    Returns whether it switched."""
    if device.type != "cuda":
        return False
    if envs.PYTORCH_CUDA_ALLOC_CONF.is_set() or envs.PYTORCH_ALLOC_CONF.is_set():
        return False
    global _expandable_on
    _set_allocator("expandable_segments:True")
    _expandable_on = True
    return True


_expandable_on = False  # use_expandable_segments switched them on in this process


def _set_allocator(settings: str) -> None:
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:  # torch before the accelerator-wide setting
        setter = torch.cuda.memory._set_allocator_settings
    setter(settings)


@contextmanager
def plain_segments():
    """Expandable segments off inside, where ``use_expandable_segments`` switched them on:
    the KV tensors are allocated once and kept while serving, so they gain nothing from
    them, and one cudaMalloc per tensor is far cheaper than mapping a large cache page by
    page, at start-up and at every wake-up."""
    if not _expandable_on:
        yield
        return
    _set_allocator("expandable_segments:False")
    try:
        yield
    finally:
        _set_allocator("expandable_segments:True")


class KVBudgetError(ValueError):
    pass


class HostSwap:
    """Per-layer (K, V) host tensors of ``shape`` (none when shape[0] == 0), allocated on a
    background thread; ``layers()`` waits for them."""

    def __init__(self, shape: tuple[int, ...], num_layers: int, dtype, pin: bool) -> None:
        self._layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._error: BaseException | None = None
        self._thread = None
        if shape[0] == 0:
            return

        def allocate() -> None:
            try:
                self._layers = [
                    (torch.empty(shape, dtype=dtype, pin_memory=pin),
                     torch.empty(shape, dtype=dtype, pin_memory=pin))
                    for _ in range(num_layers)
                ]
            except BaseException as exc:  # re-raised on first use
                self._error = exc

        # Not a daemon: the interpreter joins it before finalizing. A daemon thread still
        # inside torch at exit is ended by a forced unwind through noexcept C++ frames, which
        # aborted short runs ("terminate called without an active exception", SIGABRT).
        self._thread = threading.Thread(target=allocate, name="edge-llm-swap-alloc",
                                        daemon=False)
        self._thread.start()

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise RuntimeError(f"host swap space allocation failed: {self._error}")
        return self._layers


def kv_storage_dtype(cache: CacheConfig, dtype: torch.dtype) -> torch.dtype:
    """The KV tensors' dtype: the activations' ``dtype``, or uint8 for fp8 codes
    (``kv_cache_dtype="fp8"``, kernels/kv_fp8.py)."""
    return KV_FP8 if cache.kv_cache_dtype.startswith("fp8") else dtype


def bytes_per_block(arch: ArchConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.tensor([], dtype=dtype).element_size()
    # k and v, every layer
    return 2 * arch.num_layers * block_size * arch.num_kv_heads * arch.head_dim * elem


@dataclass
class KVCachePlan:
    num_gpu_blocks: int
    num_cpu_blocks: int
    block_bytes: int
    budget_bytes: int
    graph_bytes: int = 0  # set aside for the CUDA graphs (gpu_memory_utilization budgets)


def plan_kv_cache(
    arch: ArchConfig,
    cache: CacheConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
    peak_other_bytes: int,
    graph_bytes: int = 0,
) -> KVCachePlan:
    """How many blocks fit: the explicit budget, or a fraction of the card minus the peak
    memory of weights plus the largest batch's activations and minus the CUDA graphs' memory
    (both measured by the caller). An explicit ``kv_cache_memory`` is the KV cache alone."""
    block_bytes = bytes_per_block(arch, cache.block_size, dtype)
    if cache.kv_cache_memory is not None:
        budget = cache.kv_cache_memory
        how = f"kv_cache_memory={cache.kv_cache_memory}"
    elif device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        budget = (int(total * cache.gpu_memory_utilization) - peak_other_bytes - graph_bytes
                  - SERVING_SLACK_BYTES)
        how = (
            f"gpu_memory_utilization={cache.gpu_memory_utilization} of {total / GiB:.1f} GiB "
            f"minus {peak_other_bytes / GiB:.2f} GiB for weights and activations"
            + (f", {graph_bytes / GiB:.2f} GiB for CUDA graphs" if graph_bytes else "")
            + f" and {SERVING_SLACK_BYTES >> 20} MiB of slack"
        )
    else:
        budget = CPU_DEFAULT_KV_BYTES
        how = f"the CPU default of {CPU_DEFAULT_KV_BYTES / GiB:.0f} GiB"
    num_blocks = cache.num_gpu_blocks_override or max(budget, 0) // block_bytes
    needed = -(-max_model_len // cache.block_size)
    if num_blocks < needed:
        raise KVBudgetError(
            f"The KV cache budget ({how}: {max(budget, 0) / GiB:.2f} GiB, {num_blocks} blocks "
            f"of {cache.block_size} tokens) cannot hold one sequence of max_model_len="
            f"{max_model_len} tokens ({needed} blocks, {needed * block_bytes / GiB:.2f} GiB). "
            f"Raise --kv-cache-memory or --gpu-memory-utilization, or lower --max-model-len."
        )
    num_cpu = int(cache.swap_space * GiB) // block_bytes
    graphs = graph_bytes if cache.kv_cache_memory is None and device.type == "cuda" else 0
    return KVCachePlan(int(num_blocks), num_cpu, block_bytes, int(budget), graphs)


def slot_runs(slots: list[int]) -> list[tuple[int, int, int]]:
    """(index in ``slots``, first slot, length) of each maximal run of consecutive slots, in
    order: [5, 6, 7, 2, 3, 9] -> [(0, 5, 3), (3, 2, 2), (5, 9, 1)]."""
    runs: list[tuple[int, int, int]] = []
    for i, s in enumerate(slots):
        if runs and s == runs[-1][1] + runs[-1][2]:
            j, first, n = runs[-1]
            runs[-1] = (j, first, n + 1)
        else:
            runs.append((i, s, 1))
    return runs


class KVCache:
    """Device KV blocks per layer plus the host swap space.

    The host swap space (pinned on CUDA: pinning gigabytes takes about a second) is allocated
    on a background thread and joined on the first swap; ``host`` passes the swap space of an
    earlier cache instead (a wake-up keeps the host memory it had before sleeping).
    """

    def __init__(
        self, arch: ArchConfig, plan: KVCachePlan, block_size: int, dtype, device,
        host: HostSwap | None = None,
    ) -> None:
        shape = (plan.num_gpu_blocks, block_size, arch.num_kv_heads, arch.head_dim)
        with plain_segments():
            self.layers = [
                (torch.empty(shape, dtype=dtype, device=device),
                 torch.empty(shape, dtype=dtype, device=device))
                for _ in range(arch.num_layers)
            ]
        cpu_shape = (plan.num_cpu_blocks, *shape[1:])
        self.host = host or HostSwap(cpu_shape, arch.num_layers, dtype,
                                     pin=device.type == "cuda")
        self.device = device

    @property
    def cpu_layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self.host.layers()

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """(gpu block, cpu slot) pairs: device -> host.

        Each run of consecutive cpu slots is one asynchronous copy from a device gather
        straight into the pinned swap space: no pageable staging, no host scatter, no sync.
        Stream order makes that safe: the blocks are overwritten, and the slots read back
        (``swap_in``), only by work queued after these copies on the same stream."""
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs], device=self.device)
        runs = slot_runs([p[1] for p in pairs])
        for (k, v), (ck, cv) in zip(self.layers, self.cpu_layers, strict=True):
            for i, first, n in runs:
                ck[first:first + n].copy_(k[src[i:i + n]], non_blocking=True)
                cv[first:first + n].copy_(v[src[i:i + n]], non_blocking=True)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """(cpu slot, gpu block) pairs: host -> device; each run of consecutive cpu slots is
        one asynchronous copy from the pinned swap space (a slice of it stays pinned)."""
        if not pairs:
            return
        dst = torch.tensor([p[1] for p in pairs], device=self.device)
        runs = slot_runs([p[0] for p in pairs])
        for (k, v), (ck, cv) in zip(self.layers, self.cpu_layers, strict=True):
            for i, first, n in runs:
                k[dst[i:i + n]] = ck[first:first + n].to(self.device, non_blocking=True)
                v[dst[i:i + n]] = cv[first:first + n].to(self.device, non_blocking=True)

    def copy(self, pairs: list[tuple[int, int]]) -> None:
        """(src block, dst block) pairs within the device cache (copy-on-write of a partial
        block when a request with n > 1 forks)."""
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs], device=self.device)
        dst = torch.tensor([p[1] for p in pairs], device=self.device)
        for k, v in self.layers:
            k[dst] = k[src]
            v[dst] = v[src]
