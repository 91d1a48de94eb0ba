"""What runs before the PDL wait, compiled for sm_90 without a GPU (tests/test_kernels_compile.py's
``compile_only``): decode attention's L2 prefetch (kernels/pdl.py ``prefetch_l2``: where it
lands in the PTX, what else runs before the wait, the kernel's loop unchanged), the one-row
GEMV's first weight tiles and the rotary + K/V write's tables (no store, and nothing read
through the activations)."""

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


def _derived_from(ptx: str, params: tuple[int, ...]) -> set[str]:
    """The registers of ``ptx`` computed from the given kernel parameters (a forward pass over
    the instructions: a destination is derived when any source is)."""
    derived: set[str] = set()
    for line in ptx.splitlines():
        line = line.split("//")[0].strip().rstrip(";")
        m = re.match(r"(?:@%\w+\s+)?[\w.]+\s+(.*)", line)
        if not m or "%" not in line:
            continue
        operands = re.findall(r"%\w+|\[[^\]]*\]", m.group(1))
        if not operands:
            continue
        sources = " ".join(operands[1:])
        param = re.search(r"_param_(\d+)\]", line)
        if (param and int(param.group(1)) in params) or any(
                r in derived for r in re.findall(r"%\w+", sources)):
            derived.update(re.findall(r"%\w+", operands[0]))
    return derived


def test_gemv_weights_come_before_the_wait(monkeypatch):
    """The one-row GEMV (``EARLY_ROWS``) with PDL on (sm_90) on an H100's 132
    multiprocessors: with its grid resident at once it loads its split's first four weight
    tiles before ``griddepcontrol.wait`` (RING), else its first one (EARLY, a grid beyond
    ``RING_RESIDENT`` programs a multiprocessor); nothing before the wait stores, and no
    load there reads through the activations (x and its int32 view: the first two
    parameters), which the previous kernel writes; without ``EARLY_ROWS``, and at two rows,
    the wait comes first as in every kernel."""
    pdl = importlib.import_module("edge_llm.kernels.pdl")
    gemv = importlib.import_module("edge_llm.kernels.w4a16_gemv")
    w4 = importlib.import_module("edge_llm.kernels.w4a16")
    monkeypatch.setattr(pdl, "pdl_on", lambda device: True)
    monkeypatch.setattr(gemv, "num_sms", lambda device: 132)
    k, n, gs = 4096, 4096, 128
    qw = torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int32)
    s = torch.rand(k // gs, n).half()
    ptx = {}
    cases = {"ring": (1, gemv.EARLY_ROWS, gemv.RING_RESIDENT, (False, True)),
             "early": (1, gemv.EARLY_ROWS, 0, (True, False)),
             "off": (1, 0, gemv.RING_RESIDENT, (False, False)),
             "two rows": (2, gemv.EARLY_ROWS, gemv.RING_RESIDENT, (False, False))}
    for case, (m, early_rows, resident, want) in cases.items():
        monkeypatch.setattr(gemv, "EARLY_ROWS", early_rows)
        monkeypatch.setattr(gemv, "RING_RESIDENT", resident)
        with compile_only(90) as records:
            w4.w4a16_matmul(torch.randn(m, k).half(), qw, s, s.clone(), gs, integer_zeros=True,
                            planes_packed=True)
        assert [(name, (kw["EARLY"], kw["RING"])) for name, kw, _ in records] == [
            ("_w4a16_gemv16_kernel", want)], case
        ptx[case] = records[0][2].asm["ptx"]
    assert _derived_from("ld.param.u64 %rd1, [k_param_0];\nadd.s64 %rd2, %rd1, %rd9;",
                         (0,)) == {"%rd1", "%rd2"}  # the helper itself
    loads_before = {}
    for case in ("ring", "early"):
        code = ptx[case]
        wait = code.index("griddepcontrol.wait")
        before = re.findall(r"\b(ld|st|cp\.async|atom|red)\.global", code[:wait])
        assert before and set(before) == {"ld"}, (case, before)
        x_regs = _derived_from(code[:wait], (0, 1))
        for addr in re.findall(r"ld\.global[\w.]*\s+[^\[]*\[\s*(%\w+)", code[:wait]):
            assert addr not in x_regs, f"{case}: {addr} is read before the wait and comes from x"
        assert code.count("griddepcontrol.wait") == 1
        loads_before[case] = len(before)
    # four tiles of words (two 16-byte loads a thread each), scales and zeros against one
    assert loads_before["ring"] == 4 * loads_before["early"], loads_before
    for late in (ptx["off"], ptx["two rows"]):
        first = re.search(r"\b(ld|st|cp\.async|atom|red)\.(global|shared)", late)
        assert first and late.index("griddepcontrol.wait") < first.start()


def test_rotary_tables_come_before_the_wait(monkeypatch):
    """The rotary + K/V write kernel (``EARLY_TABLES``) with PDL on (sm_90): the slot, the
    position and its cos / sin rows are read before ``griddepcontrol.wait``, nothing before it
    stores, and no load there reads through q, k or v (the first three parameters), which
    the qkv projection writes; with ``EARLY_TABLES`` off every read follows the wait."""
    pdl = importlib.import_module("edge_llm.kernels.pdl")
    rkv = importlib.import_module("edge_llm.kernels.rotary_kv")
    monkeypatch.setattr(pdl, "pdl_on", lambda device: True)
    d, h, hkv = 128, 32, 8
    kv = torch.randn(64, 16, hkv, d).half()
    cos = torch.randn(4096, d // 2)
    ptx = {}
    for early in (True, False):
        monkeypatch.setattr(rkv, "EARLY_TABLES", early)
        with compile_only(90) as records:
            rkv.rotary_write_kv(torch.randn(5, h, d).half(), torch.randn(5, hkv, d).half(),
                                torch.randn(5, hkv, d).half(), cos, cos.clone(),
                                torch.arange(5), kv, kv.clone(), torch.arange(5))
        assert [(name, kw["EARLY_TABLES"]) for name, kw, _ in records] == [
            ("_rotary_write_kv_kernel", early)]
        ptx[early] = records[0][2].asm["ptx"]
    early = ptx[True]
    wait = early.index("griddepcontrol.wait")
    before = re.findall(r"\b(ld|st|cp\.async|atom|red)\.global", early[:wait])
    assert len(before) >= 4 and set(before) == {"ld"}, before  # slot, position, cos, sin
    qkv = _derived_from(early[:wait], (0, 1, 2))
    for addr in re.findall(r"ld\.global[\w.]*\s+[^\[]*\[\s*(%\w+)", early[:wait]):
        assert addr not in qkv, f"{addr} is read before the wait and comes from q, k or v"
    first = re.search(r"\b(ld|st|cp\.async|atom|red)\.(global|shared)", ptx[False])
    assert first and ptx[False].index("griddepcontrol.wait") < first.start()


@pytest.mark.parametrize("permuted", [False, True])
def test_norm_weight_comes_before_the_wait(monkeypatch, permuted):
    """add + RMSNorm of one 4,096-wide row with PDL on (sm_90): its weight (and an act-order
    permutation) is read before ``griddepcontrol.wait``, nothing before it stores, and no load
    there reads through x or the residual (the first two parameters), which the kernels
    before it write; x and the residual are read after it."""
    pdl = importlib.import_module("edge_llm.kernels.pdl")
    fused = importlib.import_module("edge_llm.kernels.fused")
    monkeypatch.setattr(pdl, "pdl_on", lambda device: True)
    n = 4096
    with compile_only(90) as records:
        fused.add_rms_norm(torch.randn(1, n).half(), torch.randn(1, n).half(),
                           torch.randn(n).half(), 1e-6,
                           perm=torch.randperm(n) if permuted else None)
    assert [name for name, _, _ in records] == ["_rms_norm_kernel"]
    ptx = records[0][2].asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    before = re.findall(r"\b(ld|st|cp\.async|atom|red)\.global", ptx[:wait])
    assert before and set(before) == {"ld"}, before
    inputs = _derived_from(ptx[:wait], (0, 1))
    for addr in re.findall(r"ld\.global[\w.]*\s+[^\[]*\[\s*(%\w+)", ptx[:wait]):
        assert addr not in inputs, f"{addr} is read before the wait and comes from x or residual"
    after = re.findall(r"\bld\.global", ptx[wait:])
    assert len(after) >= 2, "x and the residual are read after the wait"
