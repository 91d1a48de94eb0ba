"""The L2 prefetches before the PDL wait (kernels/pdl.py ``prefetch_l2``), compiled for sm_90
without a GPU (tests/test_kernels_compile.py's ``compile_only``): where they land in the
PTX, what else runs before the wait, and that the kernels' loops are unchanged."""

from __future__ import annotations

import importlib
import re

import pytest
import torch

from tests.test_kernels_compile import compile_only, pa, w4

pc = importlib.import_module("edge_llm.kernels.paged_common")


@pytest.mark.parametrize("silu", [False, True])
def test_gemv_prefetch_comes_before_the_wait_and_leaves_the_loop_alone(silu, monkeypatch):
    """``EDGE_LLM_GEMV_PREFETCH=N`` with PDL on (sm_90): the one-row GEMV asks L2 for its
    first K tiles' lines (``prefetch.global.L2``) before ``griddepcontrol.wait``, and its
    loop stages the same cp.async copies and unpacks the same words as without; with PDL
    off the launch compiles no prefetch at all."""
    pdl = importlib.import_module("edge_llm.kernels.pdl")
    k, n, gs = 4096, 22016, 128
    qw = torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int32)
    s = torch.rand(k // gs, n).half()
    ptx = {}
    for on, tiles in ((True, 0), (True, 4), (False, 4)):
        monkeypatch.setattr(pdl, "pdl_on", lambda device, on=on: on)
        monkeypatch.setattr(w4, "gemv_prefetch", lambda tiles=tiles: tiles)
        with compile_only(90) as records:
            w4.w4a16_matmul(torch.randn(1, k).half(), qw, s, s.clone(), gs,
                            integer_zeros=True, planes_packed=True, silu_mul=silu)
        assert [(name, kw["PREFETCH"]) for name, kw, _ in records] == [
            ("_w4a16_gemv16_kernel", tiles if on else 0)]
        ptx[on, tiles] = records[0][2].asm["ptx"]
    with_prefetch = ptx[True, 4]
    first = with_prefetch.index("prefetch.global.L2")
    assert first < with_prefetch.index("griddepcontrol.wait")
    # 16 word rows x 2 lines per K tile, words + scales + zeros, over 128 threads
    assert with_prefetch.count("prefetch.global.L2") >= 3 * 4 * 16 * 2 // 128
    assert "prefetch.global" not in ptx[True, 0] and "prefetch.global" not in ptx[False, 4]
    loop_ops = ("cp.async.cg.shared.global", "lop3.b32", "fma.rn.f16x2", "ld.global")
    for op in loop_ops:
        assert with_prefetch.count(op) == ptx[True, 0].count(op), op


@pytest.mark.parametrize("fp8", [False, True, "token-minor"])
def test_decode_prefetch_comes_before_the_wait(fp8, monkeypatch):
    """``EDGE_LLM_DECODE_PREFETCH=N`` with PDL on (sm_90): each decode program asks L2 for
    the keys and values of its split's first N tiles before ``griddepcontrol.wait``; the
    only memory reads before the wait are the context length and the block table (which
    the engine fills by copies, never from a kernel of the forward). The rest of the kernel
    compiles to the same dots, exponentials and loads; with PDL off nothing is
    prefetched."""
    pdl = importlib.import_module("edge_llm.kernels.pdl")
    d, h, hkv = 128, 32, 8
    kc = torch.randn(64, 16, hkv, d).half()
    if fp8:
        kc = kc.view(torch.uint8)[..., :d]
    vc = kc
    if fp8 == "token-minor":  # the values' lines of each block asked for as one run
        vc = pc.value_cache(tuple(kc.shape), torch.uint8)
    table = torch.randint(0, 64, (4, 16), dtype=torch.int32)
    sl = torch.full((4,), 200, dtype=torch.int32)
    q = torch.randn(4, h, d).half()
    monkeypatch.setenv("EDGE_LLM_DECODE_PREFETCH", "2")
    ptx = {}
    for on, tiles in ((True, 0), (True, 2), (False, 2)):
        monkeypatch.setattr(pdl, "pdl_on", lambda device, on=on: on)
        monkeypatch.setenv("EDGE_LLM_DECODE_PREFETCH", str(tiles))
        with compile_only(90) as records:
            pa.paged_decode(q, kc, vc, table, sl, 0.1, max_seq_len=200)
        assert [(name, kw["PREFETCH"]) for name, kw, _ in records] == [
            ("_paged_decode_kernel", tiles if on else 0)]
        ptx[on, tiles] = records[0][2].asm["ptx"]
    early = ptx[True, 2]
    wait = early.index("griddepcontrol.wait")
    assert early.index("prefetch.global.L2") < wait
    # global memory only (a layout change may go through the program's own shared memory)
    before = re.findall(r"\b(ld|st|cp\.async|atom|red)\.global", early[:wait])
    assert before == ["ld", "ld"], before
    assert "prefetch.global" not in ptx[True, 0] and "prefetch.global" not in ptx[False, 2]
    for op in ("mma.sync", "wgmma", "ex2.approx", "st.global", "atom"):
        assert early.count(op) == ptx[True, 0].count(op), op
    # the table read, and the length, unless the compiler reuses the early read of it (Triton's
    # loads are pure inline asm: two of the same address merge across the wait, which is why
    # only inputs no kernel of the forward writes may be read before it)
    assert early.count("ld.global") - ptx[True, 0].count("ld.global") in (1, 2)
