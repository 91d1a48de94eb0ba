"""The eight fp16 weight planes of a packed tile for the tl.dot paths (``fp16_planes``).

Plane j of a [BK8, BN] tile of words is W[k0 + 8r + j, :] (BK8, BN), j = 0..7. In fp32 each
weight of a plane costs about seven
instructions (shift, mask, magic-number or/sub, scale, zero, convert). Here one inline PTX
block turns each int32 word into all eight fp16 weights in 13 instructions (the magic-number
trick of kernels/w4a16_gemv.py, then one fp16x2 FMA per pair)::

    t0 = (w & 0x000F000F) | 0x64006400        (1024 + q0, 1024 + q4)      exact fp16
    t1 = (w & 0x00F000F0) | 0x64006400        (1024 + 16 q1, 1024 + 16 q5)
    t2, t3: the same on w >> 8                (q2, q6), (q3, q7)
    q pairs:  t0 - 1024,  t1 / 16 - 64, ...   exact
    W pairs:  q * (s, s) + (-z s, -z s)       fp16x2 FMA, one rounding (z s rounded first)

Outputs are the planes in order: lo(t0), lo(t1), lo(t2), lo(t3), hi(t0), ..., hi(t3).
The swap kernel (w4a16_swap.py) uses them plane by plane or joined; the "dot" kernel joins
them into one [BK, BN] tile in k order for a single dot (``join_planes``).
fp16 activations only (the planes are fp16; bf16 keeps the fp32 path). ``planes_emulated``
computes the same values in plain Triton for the interpreter, from the same fp16 pairs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .w4a16_gemv_x import bits_half, half_bits

_PLANES_ASM = tl.constexpr("\n".join([
    "{",
    ".reg .b32 t0, t1, t2, t3, s8, c1024, c16, cm64;",
    "mov.b32 c1024, 0x64006400;",  # (1024, 1024)
    "mov.b32 c16, 0x2C002C00;",  # (1/16, 1/16)
    "mov.b32 cm64, 0xD400D400;",  # (-64, -64)
    "lop3.b32 t0, $8, 0x000F000F, 0x64006400, 0xEA;",  # (a & b) | c
    "lop3.b32 t1, $8, 0x00F000F0, 0x64006400, 0xEA;",
    "shr.u32 s8, $8, 8;",
    "lop3.b32 t2, s8, 0x000F000F, 0x64006400, 0xEA;",
    "lop3.b32 t3, s8, 0x00F000F0, 0x64006400, 0xEA;",
    "sub.f16x2 t0, t0, c1024;",  # q
    "fma.rn.f16x2 t1, t1, c16, cm64;",  # (1024 + 16 q) / 16 - 64 = q
    "sub.f16x2 t2, t2, c1024;",
    "fma.rn.f16x2 t3, t3, c16, cm64;",
    "fma.rn.f16x2 t0, t0, $9, $10;",  # q s - z s
    "fma.rn.f16x2 t1, t1, $9, $10;",
    "fma.rn.f16x2 t2, t2, $9, $10;",
    "fma.rn.f16x2 t3, t3, $9, $10;",
    "mov.b32 {$0, $4}, t0;",
    "mov.b32 {$1, $5}, t1;",
    "mov.b32 {$2, $6}, t2;",
    "mov.b32 {$3, $7}, t3;",
    "}",
]))
_PLANES_CON = tl.constexpr(",".join(["=h"] * 8 + ["r"] * 3))


@triton.jit
def scale_pairs(s, zs):
    """fp32 scales and zero * scale ([1 or BK8, BN]) -> int32 fp16x2 pairs (s, s) and
    (-z s, -z s)."""
    sb = half_bits(s)
    nb = half_bits(-zs)
    return sb | (sb << 16), nb | (nb << 16)


@triton.jit
def planes_asm(packed, ss, nzs):
    """The eight fp16 planes [BK8, BN] of ``packed`` (see the module docstring)."""
    return tl.inline_asm_elementwise(
        _PLANES_ASM, _PLANES_CON, [packed, ss, nzs],
        dtype=(tl.float16, tl.float16, tl.float16, tl.float16,
               tl.float16, tl.float16, tl.float16, tl.float16),
        is_pure=True, pack=1)


@triton.jit
def _plane(packed, j: tl.constexpr, s, nzs):
    q = ((packed >> (4 * j)) & 0xF).to(tl.float32)
    return (q * s + nzs).to(tl.float16)


@triton.jit
def planes_emulated(packed, ss, nzs):
    """``planes_asm`` in plain Triton (fp32 FMA of the same fp16 pair values, one rounding
    to fp16), for the interpreter."""
    s = bits_half(ss)
    n = bits_half(nzs)
    return (_plane(packed, 0, s, n), _plane(packed, 1, s, n), _plane(packed, 2, s, n),
            _plane(packed, 3, s, n), _plane(packed, 4, s, n), _plane(packed, 5, s, n),
            _plane(packed, 6, s, n), _plane(packed, 7, s, n))


@triton.jit
def fp16_planes(packed, s, zs, USE_ASM: tl.constexpr):
    """The eight fp16 planes [BK8, BN] of ``packed`` for fp32 scales ``s`` and ``zs`` = z * s:
    by the PTX (USE_ASM) or by its plain-Triton twin (the interpreter)."""
    ss, nzs = scale_pairs(s, zs)
    if USE_ASM:
        planes = planes_asm(packed, ss, nzs)
    else:
        planes = planes_emulated(packed, ss, nzs)
    return planes


@triton.jit
def join_planes(w0, w1, w2, w3, w4, w5, w6, w7, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """The eight planes [BK8, BN] as one [BK, BN] tile in k order (row 8 r + j is plane j's
    row r) for a single K = BK dot."""
    a = tl.join(tl.join(tl.join(w0, w1), tl.join(w2, w3)),
                tl.join(tl.join(w4, w5), tl.join(w6, w7)))  # [BK8, BN, i0, i1, i2]: j = i0+2i1+4i2
    a = tl.permute(a, (0, 4, 3, 2, 1))
    return tl.reshape(a, (BLOCK_K, BLOCK_N))
