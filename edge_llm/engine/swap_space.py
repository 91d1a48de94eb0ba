"""CPU block slots that hold the KV of swapped-out sequences.

The runner owns the host tensors (``num_cpu_blocks`` slots shaped like GPU blocks); this class
only decides which slot holds what. A slot belongs to at most one swapped sequence, so no
reference counts are needed. As with ``BlockPool``, "does not fit" is a return value
(``can_swap_out``); ``allocate`` without room and double frees are caller bugs and raise.
"""

from __future__ import annotations

from collections.abc import Iterable


class SwapSpace:
    """Allocator of ``num_cpu_blocks`` CPU slots, ids ``0 .. num_cpu_blocks - 1``."""

    def __init__(self, num_cpu_blocks: int) -> None:
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks}.")
        self.num_cpu_blocks = num_cpu_blocks
        # a stack: the most recently freed slot is reused first (its host pages are warm)
        self._free: list[int] = list(range(num_cpu_blocks - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    @property
    def usage(self) -> float:
        """Fraction of slots in use, in [0, 1] (0 when there is no swap space)."""
        return len(self._used) / self.num_cpu_blocks if self.num_cpu_blocks else 0.0

    def can_swap_out(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        if num_blocks > len(self._free):
            raise RuntimeError(
                f"SwapSpace.allocate({num_blocks}) with only {len(self._free)} free slots: "
                "call can_swap_out first."
            )
        out = [self._free.pop() for _ in range(num_blocks)]
        self._used.update(out)
        return out

    def free(self, slots: Iterable[int]) -> None:
        for s in slots:
            if s not in self._used:
                raise RuntimeError(f"SwapSpace.free of slot {s}, which is not in use.")
            self._used.remove(s)
            self._free.append(s)

    def check_integrity(self) -> None:
        """Raise AssertionError unless free and used slots partition ``0 .. n - 1``."""
        free = set(self._free)
        errors = []
        if len(free) != len(self._free):
            errors.append("a slot is in the free list twice")
        if free & self._used:
            errors.append(f"slots both free and used: {sorted(free & self._used)[:10]}")
        if free | self._used != set(range(self.num_cpu_blocks)):
            errors.append(
                f"free {len(free)} + used {len(self._used)} slots do not cover "
                f"the {self.num_cpu_blocks} slots"
            )
        if errors:
            raise AssertionError("SwapSpace integrity: " + "; ".join(errors))
