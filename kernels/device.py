"""Device facts the kernel wrappers size their grids and pick their code paths by."""

from __future__ import annotations

import functools

import torch

from edge_llm import envs


@functools.cache
def _properties(index: int):
    return torch.cuda.get_device_properties(index)


def _props(device: torch.device):
    return _properties(device.index if device.index is not None else torch.cuda.current_device())


def compute_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) of a CUDA device (cached); (0, 0) for anything else."""
    if device.type != "cuda":
        return (0, 0)
    p = _props(device)
    return (p.major, p.minor)


def num_sms(device: torch.device) -> int:
    """Multiprocessor count of a CUDA device (cached); 8 for anything else (interpreter)."""
    if device.type != "cuda":
        return 8
    return _props(device).multi_processor_count


def has_fp8_cvt(device: torch.device) -> bool:
    """Whether ``device`` converts e4m3 in hardware (CUDA sm_89 and later: the 4090, Hopper;
    not the 3090's sm_86, nor the interpreter's CPU tensors); kernels/kv_fp8.py."""
    if device.type != "cuda":
        return False
    p = _props(device)
    return (p.major, p.minor) >= (8, 9)


def dots_from_registers(device: torch.device) -> bool:
    """Whether Triton compiles ``tl.dot`` on ``device`` for mma.sync, which takes both operands
    from registers (sm_8x: the 3090 and 4090; sm_11x / sm_12x: consumer Blackwell such as
    the RTX 5090, whose tensor cores have no wgmma or tcgen05), rather than Hopper's wgmma or
    datacenter Blackwell's tcgen05 (sm_90, sm_10x), whose right operand must sit in shared
    memory (Triton's AccelerateMatmul: MMA v2 below 90 and from 110 to 129). True for CPU
    tensors (the interpreter, and offline compiles for sm_89), and where DISABLE_MMA_V3 is set
    (Triton then uses mma.sync on Hopper too). The mma.sync dispatch is also the one checked
    against the consumer cards' 99 KB of shared memory per block
    (tests/test_kernels_compile.py)."""
    if device.type != "cuda":
        return True
    if envs.DISABLE_MMA_V3.get():
        return True
    return not 9 <= _props(device).major <= 10
