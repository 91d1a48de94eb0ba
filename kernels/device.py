"""Device facts the kernel wrappers size their grids by."""

from __future__ import annotations

import torch

_SM_COUNT: dict[int, int] = {}


def num_sms(device: torch.device) -> int:
    """Multiprocessor count of a CUDA device (cached); 8 for anything else (interpreter)."""
    if device.type != "cuda":
        return 8
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]
