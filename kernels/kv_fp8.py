"""The fp8 KV cache: K and V stored as float8 e4m3 (the "fn" variant: no infinities, max 448)
in uint8 tensors, unscaled (vLLM's ``kv_cache_dtype="fp8"`` without calibrated scales).

Why: the decode steps of a large batch read every sequence's whole context each step (in
the offline benchmark the K/V reads are about half of the time per output token), and a 24 GB
card holds twice the tokens. uint8 storage, not
torch.float8_e4m3fn: the bit conversions below are integer and fp32 arithmetic that every
CUDA GPU (sm_86 has no fp8 instructions), the Triton interpreter and torch agree on.

    code (8 bits) = sign | exponent (4 bits, bias 7) | mantissa (3 bits)
    decode: fp16 bits = (sign << 15) | (exponent:mantissa << 7), times 2^8 (bias 15 - 7)
            (e4m3 subnormals land on fp16 subnormals, so the same formula holds)
    encode: clamp to [-448, 448]; round to nearest even from fp32 bits: normals by adding
            half an ulp to the 20 dropped bits; below 2^-6 (e4m3 subnormals, step 2^-9) by
            the fp32 magic-number rounding of |x| * 512

The reference is torch's own conversion (``fp8_encode_ref``); tests check the Triton
functions against it bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_MAX = 448.0
KV_FP8 = torch.uint8  # the storage dtype of an fp8 KV cache


def fp8_encode_ref(x: torch.Tensor) -> torch.Tensor:
    """uint8 e4m3 codes of ``x`` (saturated at +-448, round to nearest even)."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def fp8_decode_ref(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return codes.view(torch.float8_e4m3fn).to(dtype)


def to_cache_ref(x: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """``x`` as stored in a cache of ``cache_dtype`` (fp8 codes or a plain cast)."""
    return fp8_encode_ref(x) if cache_dtype == KV_FP8 else x.to(cache_dtype)


def from_cache_ref(c: torch.Tensor) -> torch.Tensor:
    """fp32 values of cache entries (either storage)."""
    return fp8_decode_ref(c) if c.dtype == KV_FP8 else c.float()


@triton.jit
def fp8_encode(x):
    """uint8 e4m3 codes of a float tensor (see the module docstring)."""
    x = tl.minimum(tl.maximum(x.to(tl.float32), -448.0), 448.0)
    a = tl.abs(x)
    bits = a.to(tl.int32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20) - 960  # 960 = 120 << 3
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)  # 2^23: round to integer
    code = tl.where(bits >= (121 << 23), normal, sub)
    code = code | ((x.to(tl.int32, bitcast=True) >> 24) & 0x80)  # the sign, -0.0 included
    return code.to(tl.uint8)


@triton.jit
def fp8_decode(codes, CVT: tl.constexpr = False):
    """fp16 values of uint8 e4m3 codes (exact: every e4m3 value is an fp16 value, and so a
    bf16 one). ``CVT`` (sm_89 and later, ``device.has_fp8_cvt``): the hardware conversion, one
    instruction per two codes; else integer math (sm_86, the interpreter), about seven
    instructions per code, which leaves the fp8 decode attention slower than the fp16 one."""
    if CVT:
        return codes.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    c = codes.to(tl.int32)
    bits = ((c & 0x80) << 8) | ((c & 0x7F) << 7)
    return bits.to(tl.int16).to(tl.float16, bitcast=True) * 256.0  # 2^8: exact in fp16


@triton.jit
def to_cache(x, dst_ty: tl.constexpr, src_ty: tl.constexpr):
    """``x`` (fp32 or the activations' dtype) as stored in a cache of element type
    ``dst_ty``: fp8 codes of x rounded to ``src_ty`` first (what ``to_cache_ref`` of the
    ``src_ty`` tensor gives), else a cast."""
    if dst_ty == tl.uint8:
        return fp8_encode(x.to(src_ty))
    return x.to(dst_ty)
