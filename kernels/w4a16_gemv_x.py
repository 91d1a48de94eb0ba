"""The activation side of the fp16x2 GEMV (kernels/w4a16_gemv.py): fp16 bits in int32
lanes, and each word row's activations as the four fp16x2 pairs (x0, x4), (x1, x5), (x2, x6),
(x3, x7) that the PTX multiplies with the dequantized nibble pairs, in the standard word
order or the plane-packed one (kernels/w4a16_ref.py pack_planes_ref)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def half_bits(v):
    """fp16 (or bf16 -> fp16) values as their 16 bits in the low half of an int32."""
    return v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def fp16x2_pair(v):
    """Values as (v, v) fp16x2 bits in an int32."""
    b = half_bits(v)
    return b | (b << 16)


@triton.jit
def bits_half(b):
    """Inverse of half_bits: the low 16 bits of an int32 as fp32."""
    return (b & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def masked_load(ptrs, mask, other, EVEN: tl.constexpr):
    """tl.load, masked unless EVEN (every address in range)."""
    if EVEN:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=mask, other=other)


@triton.jit
def x_pairs(x_ptr, xi_ptr, rows, r_lim, X_FP16: tl.constexpr, EVEN: tl.constexpr,
            VEC: tl.constexpr, PLANES: tl.constexpr, k0=0, USE_ASM: tl.constexpr = False):
    """For word rows ``rows`` of one activation row: the four fp16x2 pairs (x0, x4), (x1, x5),
    (x2, x6), (x3, x7) as int32 [BK8]. fp16 activations are read as int32 words
    (x_{2i}, x_{2i+1}) at ``xi_ptr`` and recombined; others load 8 values and convert.
    Word rows from ``r_lim`` on read zeros. EVEN: every row is in range (no masks). VEC: the
    four words of a row in one 16-byte load.
    PLANES (plane-packed words, pack_planes_ref; fp16 x; ``k0`` the tile's first row, a
    multiple of 128): x_j of word row r is column
    k0 + 128 (r // 16) + 16 j + r % 16, read as a [BK8 / 2, 8] tile of int32 words of two
    rows (staged by cp.async like the standard path) and regrouped into the pairs in
    registers: faster than eight 2-byte loads per word row (not staged) or one [BK8, 8]
    fp16 tile."""
    r_mask = rows < r_lim
    if PLANES or (X_FP16 and VEC):
        xa, xb, xc, xd = pairs_from_raw(x_raw(xi_ptr, rows, r_lim, EVEN, PLANES, k0),
                                        rows.shape[0], PLANES, USE_ASM)
    elif X_FP16:
        base = xi_ptr + rows * 4
        x01 = masked_load(base + 0, r_mask, 0, EVEN)
        x23 = masked_load(base + 1, r_mask, 0, EVEN)
        x45 = masked_load(base + 2, r_mask, 0, EVEN)
        x67 = masked_load(base + 3, r_mask, 0, EVEN)
        xa, xb, xc, xd = _pairs_of_words(x01, x23, x45, x67)
    else:
        base = x_ptr + rows * 8
        xa = (half_bits(masked_load(base + 0, r_mask, 0.0, EVEN))
              | (half_bits(masked_load(base + 4, r_mask, 0.0, EVEN)) << 16))[:, None]
        xb = (half_bits(masked_load(base + 1, r_mask, 0.0, EVEN))
              | (half_bits(masked_load(base + 5, r_mask, 0.0, EVEN)) << 16))[:, None]
        xc = (half_bits(masked_load(base + 2, r_mask, 0.0, EVEN))
              | (half_bits(masked_load(base + 6, r_mask, 0.0, EVEN)) << 16))[:, None]
        xd = (half_bits(masked_load(base + 3, r_mask, 0.0, EVEN))
              | (half_bits(masked_load(base + 7, r_mask, 0.0, EVEN)) << 16))[:, None]
    return xa, xb, xc, xd


@triton.jit
def x_raw(xi_ptr, rows, r_lim, EVEN: tl.constexpr, PLANES: tl.constexpr, k0=0):
    """The int32 words of fp16 x that word rows ``rows`` multiply, as loaded (``x_pairs``
    with PLANES or VEC; ``pairs_from_raw`` makes the pairs): PLANES, a [BK8 / 2, 8] tile
    (word i of a plane tile covers rows 2 i and 2 i + 1); else [BK8, 4]: x01, x23, x45, x67
    of each row. Split from the pairing so a caller can load a later tile's x ahead."""
    if PLANES:
        nr: tl.constexpr = rows.shape[0]
        js = tl.arange(0, 8)
        loc = tl.arange(0, nr // 2)
        r_loc = (loc // 8) * 16 + (loc % 8) * 2
        offs = tl.multiple_of(k0 >> 1, 64) + ((loc // 8) * 64 + loc % 8)[:, None] \
            + 8 * js[None, :]
        return masked_load(xi_ptr + offs, ((k0 >> 3) + r_loc < r_lim)[:, None], 0, EVEN)
    else:
        return masked_load(xi_ptr + rows[:, None] * 4 + tl.arange(0, 4)[None, :],
                           (rows < r_lim)[:, None], 0, EVEN)


@triton.jit
def pairs_from_raw(wv, nr: tl.constexpr, PLANES: tl.constexpr, USE_ASM: tl.constexpr = False):
    """The four pairs of ``x_pairs``, [BK8, 1] each, from ``x_raw``'s words. USE_ASM
    (PLANES): each pair is one byte permute of two loaded words, before the words are
    spread over the tile's rows (the interpreter has no PTX: shifts and masks there)."""
    if PLANES:
        if USE_ASM:
            # wv[i, j] = (x_j of row 2 i, x_j of row 2 i + 1): pair (j, j + 4) of row 2 i + b
            # is half b of wv[i, j] and of wv[i, j + 4]
            lo4, hi4 = tl.split(tl.permute(tl.reshape(wv, (nr // 2, 2, 4)), (0, 2, 1)))
            p0, p1 = tl.inline_asm_elementwise(
                "prmt.b32 $0, $2, $3, 0x5410;\n\tprmt.b32 $1, $2, $3, 0x7632;", "=r,=r,r,r",
                [lo4, hi4], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
            pairs = tl.reshape(tl.permute(tl.join(p0, p1), (0, 2, 1)), (nr, 2, 2))
        else:
            both = tl.join(wv & 0xFFFF, (wv >> 16) & 0xFFFF)  # [i, j, b]: row 2 i + b
            hb = tl.reshape(tl.permute(both, (0, 2, 1)), (nr, 8))  # (BK8, 8): x_j bits
            lo, hi = tl.split(tl.permute(tl.reshape(hb, (nr, 2, 4)), (0, 2, 1)))  # x_i, x_4+i
            pairs = tl.reshape(lo | (hi << 16), (nr, 2, 2))
        p02, p13 = tl.split(pairs)  # [r, a, b]: pair i = 2 a + b; b = 0: pairs 0, 2
        xa, xc = tl.split(p02)
        xb, xd = tl.split(p13)
        xa, xb, xc, xd = xa[:, None], xb[:, None], xc[:, None], xd[:, None]
    else:
        lo, hi = tl.split(tl.reshape(wv, (nr, 2, 2)))  # (x01, x45), (x23, x67)
        x01, x45 = tl.split(lo)
        x23, x67 = tl.split(hi)
        xa, xb, xc, xd = _pairs_of_words(x01, x23, x45, x67)
    return xa, xb, xc, xd


@triton.jit
def _pairs_of_words(x01, x23, x45, x67):
    """(x0, x4), (x1, x5), (x2, x6), (x3, x7) as fp16x2 words, [BK8, 1] each, from the
    words (x_{2i}, x_{2i+1}) of each row, [BK8]."""
    xa = (x01 & 0xFFFF) | (x45 << 16)
    xb = ((x01 >> 16) & 0xFFFF) | (x45 & -65536)
    xc = (x23 & 0xFFFF) | (x67 << 16)
    xd = ((x23 >> 16) & 0xFFFF) | (x67 & -65536)
    return xa[:, None], xb[:, None], xc[:, None], xd[:, None]
