"""KV cache tensors: sizing from a memory budget, allocation, swaps and block copies.

Per layer: k and v of shape (num_blocks, block_size, num_kv_heads, head_dim), allocated once.
The CPU swap space mirrors that layout in host memory (pinned on CUDA).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from edge_llm.config import CacheConfig
from edge_llm.model.arch import ArchConfig

logger = logging.getLogger(__name__)
GiB = 1 << 30
CPU_DEFAULT_KV_BYTES = 2 * GiB  # CPU has no card to take a fraction of; like vLLM's CPU default


class KVBudgetError(ValueError):
    pass


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


def plan_kv_cache(
    arch: ArchConfig,
    cache: CacheConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
    peak_other_bytes: int,
) -> KVCachePlan:
    """How many blocks fit: the explicit budget, or a fraction of the card minus the peak
    memory of weights plus the largest batch's activations (measured by the caller)."""
    block_bytes = bytes_per_block(arch, cache.block_size, dtype)
    if cache.kv_cache_memory is not None:
        budget = cache.kv_cache_memory
        how = f"kv_cache_memory={cache.kv_cache_memory}"
    elif device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        budget = int(total * cache.gpu_memory_utilization) - peak_other_bytes
        how = (
            f"gpu_memory_utilization={cache.gpu_memory_utilization} of {total / GiB:.1f} GiB "
            f"minus {peak_other_bytes / GiB:.2f} GiB for weights and activations"
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
    return KVCachePlan(int(num_blocks), num_cpu, block_bytes, int(budget))


class KVCache:
    def __init__(
        self, arch: ArchConfig, plan: KVCachePlan, block_size: int, dtype, device
    ) -> None:
        shape = (plan.num_gpu_blocks, block_size, arch.num_kv_heads, arch.head_dim)
        self.layers = [
            (torch.empty(shape, dtype=dtype, device=device),
             torch.empty(shape, dtype=dtype, device=device))
            for _ in range(arch.num_layers)
        ]
        cpu_shape = (plan.num_cpu_blocks, *shape[1:])
        pin = device.type == "cuda"
        self.cpu_layers = [
            (torch.empty(cpu_shape, dtype=dtype, pin_memory=pin),
             torch.empty(cpu_shape, dtype=dtype, pin_memory=pin))
            for _ in range(arch.num_layers)
        ] if plan.num_cpu_blocks else []
        self.device = device

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """(gpu block, cpu slot) pairs: device -> host."""
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs], device=self.device)
        dst = torch.tensor([p[1] for p in pairs])
        for (k, v), (ck, cv) in zip(self.layers, self.cpu_layers, strict=True):
            ck[dst] = k[src].to("cpu")
            cv[dst] = v[src].to("cpu")

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """(cpu slot, gpu block) pairs: host -> device."""
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs])
        dst = torch.tensor([p[1] for p in pairs], device=self.device)
        for (k, v), (ck, cv) in zip(self.layers, self.cpu_layers, strict=True):
            k[dst] = ck[src].to(self.device, non_blocking=True)
            v[dst] = cv[src].to(self.device, non_blocking=True)

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
