"""Decode attention's L2 prefetch before the PDL wait (kernels/pdl.py ``prefetch_l2``),
compiled for sm_90 without a GPU (tests/test_kernels_compile.py's ``compile_only``): where it
lands in the PTX, what else runs before the wait, and that the kernel's loop is unchanged."""

from __future__ import annotations

import importlib
import re

import pytest
import torch

from tests.test_kernels_compile import compile_only, pa

pd = importlib.import_module("edge_llm.kernels.paged_decode")


@pytest.mark.parametrize("fp8", [False, True])
def test_decode_prefetch_comes_before_the_wait(fp8, monkeypatch):
    """``PREFETCH_TILES`` with PDL on (sm_90): each decode program asks L2 for the keys and
    values of its split's first tiles (the default, and 2) before ``griddepcontrol.wait``; the
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
    table = torch.randint(0, 64, (4, 16), dtype=torch.int32)
    sl = torch.full((4,), 200, dtype=torch.int32)
    q = torch.randn(4, h, d).half()
    ptx = {}
    for on, tiles in ((True, 0), (True, pd.PREFETCH_TILES), (True, 2), (False, 2)):
        monkeypatch.setattr(pdl, "pdl_on", lambda device, on=on: on)
        monkeypatch.setattr(pd, "PREFETCH_TILES", tiles)
        with compile_only(90) as records:
            pa.paged_decode(q, kc, vc, table, sl, 0.1, max_seq_len=200)
        assert [(name, kw["PREFETCH"]) for name, kw, _ in records] == [
            ("_paged_decode_kernel", tiles if on else 0)]
        ptx[on, tiles] = records[0][2].asm["ptx"]
    assert "prefetch.global.L2" in ptx[True, pd.PREFETCH_TILES]
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
