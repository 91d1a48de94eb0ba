"""Host-side integer helpers for launch grids and block sizes.

``triton.cdiv`` and ``triton.next_power_of_2`` are ``constexpr_function``s in Triton 3.6:
called from host code each unwraps its arguments and builds constexpr objects, about 2 us a
call against 0.03 us for the plain arithmetic (benchmarks/host_forward.py measured the eager
forward's host cost; a W4A16 launch made eight such calls). The kernels keep ``tl.cdiv``.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints (b > 0)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of 2 >= n (1 for n <= 1), as ``triton.next_power_of_2``."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
