"""The inline PTX of the fp16x2 W4A16 path (kernels/w4a16_gemv.py): one packed word of eight
nibbles turned into four fp16 pairs and multiplied by ``rows`` activation rows, as strings
for ``tl.inline_asm_elementwise`` and their operand constraints, one constant per variant
(Triton takes only ``tl.constexpr`` globals inside a kernel)."""

from __future__ import annotations

import triton.language as tl


def asm_text(rows: int, fold: bool = False) -> str:
    """PTX for one word and ``rows`` activation rows: outputs $0..$rows-1 (fp32 bits), inputs
    $rows = the word, $rows+1 = (z, z) as fp16x2, then four fp16x2 x pairs per row. All four
    products per half are summed in fp16 before one conversion (fewer instructions than two
    fp16 sums; overflows for |x| above ~1,000 instead of ~2,000). ``fold``: the zero
    point is folded into the constants that remove the exponent bias, four fp16x2
    instructions fewer per word: $rows+1 = (1024 + z, 1024 + z), $rows+2 = (-64 - z, -64 - z),
    the x pairs from $rows+3 (worth it when z is built once per tile, not per word)."""
    w = f"${rows}"
    n_z = 2 if fold else 1
    lines = [
        "{",
        ".reg .b32 t0, t1, t2, t3, s8, c1024, c16, cm64, p0;",
        ".reg .f16 h0, h1;",
        ".reg .f32 f0, f1;",
        "mov.b32 c1024, 0x64006400;",  # (1024, 1024)
        "mov.b32 c16, 0x2C002C00;",  # (1/16, 1/16)
        "mov.b32 cm64, 0xD400D400;",  # (-64, -64)
        f"lop3.b32 t0, {w}, 0x000F000F, 0x64006400, 0xEA;",  # (a & b) | c: (1024 + q, ...)
        f"lop3.b32 t1, {w}, 0x00F000F0, 0x64006400, 0xEA;",  # (1024 + 16 q, ...)
        f"shr.u32 s8, {w}, 8;",
        "lop3.b32 t2, s8, 0x000F000F, 0x64006400, 0xEA;",
        "lop3.b32 t3, s8, 0x00F000F0, 0x64006400, 0xEA;",
    ]
    if fold:
        za, zb = f"${rows + 1}", f"${rows + 2}"
        lines += [
            f"sub.f16x2 t0, t0, {za};",  # (1024 + q) - (1024 + z) = q - z, exact
            f"fma.rn.f16x2 t1, t1, c16, {zb};",  # (1024 + 16 q) / 16 - 64 - z = q - z
            f"sub.f16x2 t2, t2, {za};",
            f"fma.rn.f16x2 t3, t3, c16, {zb};",
        ]
    else:
        zz = f"${rows + 1}"
        lines += [
            "sub.f16x2 t0, t0, c1024;",  # 1024 + q - 1024 = q
            "fma.rn.f16x2 t1, t1, c16, cm64;",  # (1024 + 16 q) / 16 - 64 = q
            "sub.f16x2 t2, t2, c1024;",
            "fma.rn.f16x2 t3, t3, c16, cm64;",
            f"sub.f16x2 t0, t0, {zz};",  # q - z (exact for integer zero points)
            f"sub.f16x2 t1, t1, {zz};",
            f"sub.f16x2 t2, t2, {zz};",
            f"sub.f16x2 t3, t3, {zz};",
        ]
    for m in range(rows):
        xa, xb, xc, xd = (f"${rows + 1 + n_z + 4 * m + i}" for i in range(4))
        lines += [
            f"mul.rn.f16x2 p0, t0, {xa};",
            f"fma.rn.f16x2 p0, t1, {xb}, p0;",
            f"fma.rn.f16x2 p0, t2, {xc}, p0;",
            f"fma.rn.f16x2 p0, t3, {xd}, p0;",
            "mov.b32 {h0, h1}, p0;",
            "cvt.f32.f16 f0, h0;",
            "cvt.f32.f16 f1, h1;",
            f"add.f32 ${m}, f0, f1;",
        ]
    lines.append("}")
    return "\n".join(lines)


def constraints(rows: int, fold: bool = False) -> str:
    return ",".join(["=r"] * rows + ["r"] * ((3 if fold else 2) + 4 * rows))


ASM1 = tl.constexpr(asm_text(1))
ASM2 = tl.constexpr(asm_text(2))
ASM3 = tl.constexpr(asm_text(3))
ASM4 = tl.constexpr(asm_text(4))
CON1 = tl.constexpr(constraints(1))
CON2 = tl.constexpr(constraints(2))
CON3 = tl.constexpr(constraints(3))
CON4 = tl.constexpr(constraints(4))
# the folded zero point: 1-2 rows (the one-row GEMV's K tiles of one group)
ASM1F = tl.constexpr(asm_text(1, fold=True))
ASM2F = tl.constexpr(asm_text(2, fold=True))
CON1F = tl.constexpr(constraints(1, fold=True))
CON2F = tl.constexpr(constraints(2, fold=True))
# FOLD's bias constants from two columns' fp16 zero points z0, z1 (one register, pack=2):
# $0, $1 = (1024 + z, 1024 + z) of each, $2, $3 = (-64 - z, -64 - z); exact for integer z
FOLD_Z = tl.constexpr("\n".join([
    "{",
    ".reg .b32 c, t, u;",
    "mov.b32 c, 0x64006400;",
    "add.rn.f16x2 t, $4, c;",
    "prmt.b32 $0, t, 0, 0x1010;",
    "prmt.b32 $1, t, 0, 0x3232;",
    "mov.b32 c, 0xD400D400;",
    "sub.rn.f16x2 u, c, $4;",
    "prmt.b32 $2, u, 0, 0x1010;",
    "prmt.b32 $3, u, 0, 0x3232;",
    "}",
]))
FOLD_Z_CON = tl.constexpr("=r,=r,=r,=r,r")
