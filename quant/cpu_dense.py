"""Dense bf16 copies of 4-bit weights for the CPU's many-row steps (prompts, large batches).

Why: torch's int4 CPU kernel (quant/cpu_int4.py) makes a pass over the packed words for each
row of x, so its time grows with the rows, while a dense bf16 matmul runs on the AMX units.
Measured on the 2-core Xeon with the demo's four layer shapes (one thread, BENCHMARKS.md
"CPU"), int4 took 0.35x the dense matmul's time for 1 row, 1.1x for 8, 2.1x for 16 and 7.3x
for 128 (a 128-token prompt). So a forward of at least ``DENSE_MIN_ROWS`` rows runs each
4-bit linear on a dense bf16 copy of its weight, made at the first such call; decode steps keep
the int4 words (a decode step reads every weight once: 4x fewer bytes is what counts there).

Memory rule: a copy takes 2 bytes a weight (4x the int4 words). All copies together may take
at most ``DENSE_RAM_FRACTION`` (1/8) of the memory available when the first copy is made
(``MemAvailable`` of /proc/meminfo, lowered to what the cgroup's ``memory.max`` leaves);
a linear whose copy would pass that budget keeps the int4 kernel for every step. The demo's
copies take 0.2 GB. A copy's share goes back to the budget when the copy is freed (its linear
dropped its CPU forms, or the model is gone).
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path

import torch

DENSE_MIN_ROWS = 16
DENSE_RAM_FRACTION = 1 / 8


def available_memory_bytes() -> int | None:
    """Bytes this process could still allocate: MemAvailable, capped by the cgroup v2 limit;
    None where neither can be read."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            left = max(int(limit) - used, 0)
            avail = left if avail is None else min(avail, left)
    except (OSError, ValueError):
        pass
    return avail


class DenseBudget:
    """The bytes the dense copies may take together (fixed at the first request)."""

    def __init__(self, fraction: float = DENSE_RAM_FRACTION) -> None:
        self.fraction = fraction
        self.limit: int | None = None
        self.used = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` for one copy; False where that would pass the budget."""
        with self._lock:
            if self.limit is None:
                avail = available_memory_bytes()
                self.limit = 0 if avail is None else int(avail * self.fraction)
            if self.used + nbytes > self.limit:
                return False
            self.used += nbytes
            return True

    def give_back(self, nbytes: int) -> None:
        with self._lock:
            self.used = max(self.used - nbytes, 0)


BUDGET = DenseBudget()


def dense_bf16_copy(w_kn: torch.Tensor) -> torch.Tensor | None:
    """``w_kn`` (K, N), in the order x's columns arrive, as an ``F.linear`` weight: bf16
    (N, K) contiguous; None where the budget has no room for it."""
    k, n = w_kn.shape
    nbytes = 2 * k * n
    if not BUDGET.take(nbytes):
        return None
    dense = w_kn.t().to(torch.bfloat16).contiguous()
    weakref.finalize(dense, BUDGET.give_back, nbytes)
    return dense
