"""Host-side integer helpers for launch grids and block sizes.

``triton.cdiv`` and ``triton.next_power_of_2`` are ``constexpr_function``s in Triton 3.6:
called from host code each unwraps its arguments and builds constexpr objects, nearly a
hundred times the cost of the plain arithmetic, and a W4A16 launch made eight such calls.
The kernels keep ``tl.cdiv``.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints (b > 0)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of 2 >= n (1 for n <= 1), as ``triton.next_power_of_2``."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
