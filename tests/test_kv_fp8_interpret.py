"""The fp8 KV cache (kernels/kv_fp8.py) under TRITON_INTERPRET=1: the e4m3 codes of the Triton
bit conversions against torch's float8_e4m3fn, bit for bit; the K/V writes into uint8
caches against their references, bit for bit; decode and prefill attention over uint8 caches
against the reference on the same codes. Same child-process pattern as
tests/test_kernels_interpret.py; fresh random inputs, never zeros."""

from __future__ import annotations

import sys

import pytest

try:
    from tests.interpret_child import check_case, list_cases, run_cases, run_interpreted
    from tests.test_kernels_interpret import _paged_problem
except ImportError:  # run as the interpreted child script: tests/ is sys.path[0]
    from interpret_child import check_case, list_cases, run_cases, run_interpreted
    from test_kernels_interpret import _paged_problem


def _values():
    """Magnitudes from e4m3's subnormals (2^-9) past its saturation (448), both signs, the
    ties of both ranges, and zeros of both signs."""
    import torch

    mags = torch.exp2(torch.rand(4000) * 22 - 12)  # 2^-12 .. 2^10
    signs = torch.where(torch.rand(4000) < 0.5, -1.0, 1.0)
    ties = torch.tensor([2.0 ** -10, 3 * 2.0 ** -10, 1.0625, 1.1875, 0.0, -0.0, 448.0, 464.0,
                         -500.0, 2.0 ** -6, 15 * 2.0 ** -10])
    return torch.cat([mags * signs, ties])


def case_codes_match_torch():
    import torch
    import triton
    import triton.language as tl

    from edge_llm.kernels.kv_fp8 import fp8_decode, fp8_decode_ref, fp8_encode, fp8_encode_ref

    # the kernel below resolves the jit functions it calls through this module's globals
    globals().update(fp8_encode=fp8_encode, fp8_decode=fp8_decode, tl=tl)

    @triton.jit
    def roundtrip(x_ptr, code_ptr, back_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        code = fp8_encode(tl.load(x_ptr + offs, mask=mask, other=0.0))
        tl.store(code_ptr + offs, code, mask=mask)
        tl.store(back_ptr + offs, fp8_decode(code), mask=mask)

    for dtype in (torch.float32, torch.float16):
        x = _values().to(dtype)
        code = torch.empty(x.shape, dtype=torch.uint8)
        back = torch.empty(x.shape, dtype=torch.float32)
        roundtrip[(triton.cdiv(x.numel(), 512),)](x, code, back, x.numel(), BLOCK=512)
        ref = fp8_encode_ref(x)
        bad = (code != ref).nonzero().flatten()[:5]
        assert bad.numel() == 0, f"{dtype}: {x[bad].tolist()} -> {code[bad].tolist()}, " \
                                 f"torch {ref[bad].tolist()}"
        assert torch.equal(back, fp8_decode_ref(ref)), dtype
    # every code decodes as torch does (0x7F / 0xFF are NaN in e4m3fn and never written)
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    back = torch.empty(codes.shape, dtype=torch.float32)
    x = fp8_decode_ref(codes)
    roundtrip[(1,)](x, torch.empty_like(codes), back, codes.numel(), BLOCK=256)
    assert torch.equal(back, x)


def case_write_kv_into_fp8_cache():
    import torch

    from edge_llm.kernels.paged_attention import write_kv, write_kv_ref

    for bs, dtype in ((8, torch.float32), (16, torch.float16)):
        kc = torch.randint(0, 120, (6, bs, 3, 24), dtype=torch.uint8)
        vc = torch.randint(0, 120, (6, bs, 3, 24), dtype=torch.uint8)
        kc_ref, vc_ref = kc.clone(), vc.clone()
        t = 9
        slots = torch.randperm(6 * bs)[:t]
        slots[2] = -1  # padding token: skipped
        k, v = (torch.randn(t, 3, 24) * 4).to(dtype), torch.randn(t, 3, 24).to(dtype)
        write_kv(k, v, kc, vc, slots)
        write_kv_ref(k, v, kc_ref, vc_ref, slots)
        assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref), f"bs={bs} {dtype}"


def case_rotary_write_kv_into_fp8_cache():
    import torch

    from edge_llm.kernels.kv_fp8 import fp8_decode_ref
    from edge_llm.kernels.paged_attention import write_kv_ref
    from edge_llm.kernels.rotary import rotary_ref
    from edge_llm.kernels.rotary_kv import rotary_write_kv

    t, h, hkv, d, bs = 7, 6, 2, 32, 16
    q, k, v = (torch.randn(t, n, d).to(torch.float16) for n in (h, hkv, hkv))
    pos = torch.randint(0, 60, (t,))
    freqs = torch.outer(torch.arange(64.0), 1.0 / 10000 ** (torch.arange(0, d, 2) / d))
    cos, sin = freqs.cos(), freqs.sin()
    kc = torch.zeros(4, bs, hkv, d, dtype=torch.uint8)
    vc = torch.zeros_like(kc)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.randperm(4 * bs)[:t]
    q_out = rotary_write_kv(q, k, v, cos, sin, pos, kc, vc, slots)
    q_ref, k_rot = rotary_ref(q, k, cos, sin, pos)
    write_kv_ref(k_rot, v, kc_ref, vc_ref, slots)
    assert torch.equal(vc, vc_ref)
    # the kernel rotates in fp32 and rounds to fp16 as the reference does; a one-ulp fp16
    # difference can move a code by one step, so compare values, not codes
    diff = (fp8_decode_ref(kc) - fp8_decode_ref(kc_ref)).abs()
    assert float(diff.max()) <= 0.0625 * float(fp8_decode_ref(kc_ref).abs().max())
    assert float((kc != kc_ref).float().mean()) < 0.01
    assert float((q_out.float() - q_ref.float()).abs().max()) < 1e-2


def case_attention_over_fp8_cache():
    import torch

    from edge_llm.kernels.kv_fp8 import fp8_encode_ref
    from edge_llm.kernels.paged_attention import (
        DecodeConfig,
        paged_attention_ref,
        paged_decode,
        paged_prefill,
    )

    for nq, ctx, h, hkv, d, bs in (([1, 1, 1], [37, 5, 70], 8, 2, 32, 16),
                                   ([4, 9], [20, 9], 6, 3, 24, 8)):
        q, kc, vc, table, qsl, sl = _paged_problem(nq, ctx, h, hkv, d, bs, torch.float16)
        kc, vc = fp8_encode_ref(kc.float() * 2), fp8_encode_ref(vc)
        ref = paged_attention_ref(q, kc, vc, table, qsl, sl, d ** -0.5)
        if all(n == 1 for n in nq):
            out = paged_decode(q, kc, vc, table, sl, d ** -0.5, max(ctx),
                               DecodeConfig(block_n=16, num_splits=2))
        else:
            out = paged_prefill(q, kc, vc, table, qsl, sl, d ** -0.5)
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        assert err < 1e-2, f"nq={nq} ctx={ctx}: rel err {err:.2e}"


def case_attention_over_blocks_and_tiles():
    """Decode and prefill over an fp8 cache: blocks of 8-32 tokens against key tiles of
    16-64 (a block longer than the tile included), context splits, a head size that is not a
    power of two; slots past each context hold stale codes, which the keys' whole-block
    reads must not let through."""
    import torch

    from edge_llm.kernels.kv_fp8 import fp8_encode_ref
    from edge_llm.kernels.paged_attention import (
        DecodeConfig,
        PrefillConfig,
        paged_attention_ref,
        paged_decode,
        paged_prefill,
    )

    for nq, ctx, h, hkv, d, bs, block_n, splits in (
            ([1, 1, 1], [37, 5, 70], 8, 2, 32, 16, 16, 2),
            ([1, 1], [100, 33], 4, 4, 32, 16, 64, 1),
            ([1, 1], [45, 64], 6, 3, 24, 32, 16, 3),
            ([1], [29], 4, 2, 32, 8, 32, 0),
            ([4, 9], [20, 9], 6, 3, 24, 8, 16, 0),
            ([5, 1, 30], [90, 40, 30], 4, 2, 32, 16, 32, 2),
            ([3], [50], 4, 1, 32, 32, 16, 3)):
        q, kc, vc, table, qsl, sl = _paged_problem(nq, ctx, h, hkv, d, bs, torch.float16)
        kc, vc = fp8_encode_ref(kc.float() * 2), fp8_encode_ref(vc * 4)
        ref = paged_attention_ref(q, kc, vc, table, qsl, sl, d ** -0.5)
        if all(n == 1 for n in nq):
            out = paged_decode(q, kc, vc, table, sl, d ** -0.5, max(ctx),
                               DecodeConfig(block_n=block_n, num_splits=splits))
        else:
            out = paged_prefill(q, kc, vc, table, qsl, sl, d ** -0.5,
                                config=PrefillConfig(block_n=block_n, num_splits=splits))
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        assert err < 1e-2, f"nq={nq} ctx={ctx} bs={bs} block_n={block_n}: rel err {err:.2e}"


CASES = list_cases(globals())


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    return run_interpreted(__file__, tmp_path_factory.mktemp("interp_fp8"))


@pytest.mark.parametrize("case", CASES)
def test_fp8_kv_in_interpreter(report, case):
    check_case(report, case)


if __name__ == "__main__":  # the interpreted child (run_interpreted)
    run_cases(sys.argv[1], globals(), CASES)
