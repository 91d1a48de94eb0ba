"""Device facts the kernel wrappers size their grids and pick their code paths by."""

from __future__ import annotations

import torch

_SM_COUNT: dict[int, int] = {}
_CAPABILITY: dict[int, tuple[int, int]] = {}


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def num_sms(device: torch.device) -> int:
    """Multiprocessor count of a CUDA device (cached); 8 for anything else (interpreter)."""
    if device.type != "cuda":
        return 8
    idx = _index(device)
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def has_fp8_cvt(device: torch.device) -> bool:
    """Whether ``device`` converts e4m3 in hardware (CUDA sm_89 and later: the 4090, Hopper;
    not the 3090's sm_86, nor the interpreter's CPU tensors); kernels/kv_fp8.py."""
    if device.type != "cuda":
        return False
    idx = _index(device)
    if idx not in _CAPABILITY:
        _CAPABILITY[idx] = torch.cuda.get_device_capability(idx)
    return _CAPABILITY[idx] >= (8, 9)
