"""Every launch the dispatchers choose, compiled for sm_86 / sm_89 / sm_120 (RTX 3090 / 4090 /
5090) without a GPU; the W4A16 dispatch and attention also for sm_75 (the T4 of cloud
instances, 64 KB).

The wrappers run on CPU tensors while Triton's launch is replaced by a compile for the chosen
target; each kernel's metadata must show at most 99 KB of shared memory per block (the limit
of these consumer cards) and its PTX no Hopper-only instruction (wgmma, TMA bulk tensor
copies). On CPU tensors the dispatch takes its mma.sync choices, as on these cards
(kernels/device.py dots_from_registers).
"""

from __future__ import annotations

import contextlib
import importlib
import re

import pytest
import torch

triton = pytest.importorskip("triton")
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature
except ImportError:  # a Triton without these internals: nothing to check here
    pytest.skip("this Triton build has no offline compile path", allow_module_level=True)

fu = importlib.import_module("edge_llm.kernels.fused")
rot = importlib.import_module("edge_llm.kernels.rotary")
pa = importlib.import_module("edge_llm.kernels.paged_attention")
w4 = importlib.import_module("edge_llm.kernels.w4a16")
wc = importlib.import_module("edge_llm.kernels.w4a16_config")

SHARED_LIMIT = 99 * 1024
T4_SHARED_LIMIT = 64 * 1024  # sm_75
ARCH = 89


@contextlib.contextmanager
def compile_only(arch: int):
    """Within the block, ``kernel[grid](...)`` compiles for ``arch`` instead of launching."""
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    records: list[tuple[str, dict, object]] = []
    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        binder = create_function_from_signature(self.signature, self.params, backend)
        bound, spec, opts = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, spec,
                                                                opts)
        kern = triton.compile(ASTSource(self, signature, constexprs, attrs), target=target,
                              options=options.__dict__)
        records.append((self.__name__, dict(kwargs), kern))
        return kern

    JITFunction.run = run
    try:
        yield records
    finally:
        JITFunction.run = original


def _assert_fits(records, limit: int = SHARED_LIMIT) -> None:
    assert records, "nothing was compiled"
    for name, kwargs, kern in records:
        shared = int(kern.metadata.shared)
        consts = {k: v for k, v in kwargs.items() if k.isupper() or k.startswith("num_")}
        assert shared <= limit, f"{name} {consts}: {shared} B of shared memory"
        ptx = kern.asm["ptx"]
        assert "wgmma" not in ptx and "cp.async.bulk.tensor" not in ptx, f"{name} {consts}"


@pytest.mark.parametrize("arch", [75, 86, 89, 120])  # T4, 3090, 4090, 5090
@pytest.mark.parametrize("k,n", [(4096, 12288), (11008, 4096)])
def test_w4a16_dispatched_configs_fit(k, n, arch, monkeypatch):
    # Above 64 rows the dispatcher dequantizes, then calls torch.matmul on the (never written)
    # weights. Only the dequantize kernel's compile matters here. An fp16 CPU matmul of
    # uninitialised memory (denormals) took minutes on one machine, so it is stubbed.
    monkeypatch.setattr(torch, "matmul", lambda a, b: a.new_zeros(a.shape[0], b.shape[1]))
    qw = torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int32)
    chosen = []  # (act, config) of every launch: the mma.sync table's rows on CPU tensors

    def lookup(*args, looked_up=w4.lookup):
        chosen.append((args[1], looked_up(*args)))
        return chosen[-1][1]

    monkeypatch.setattr(w4, "lookup", lookup)
    with compile_only(arch) as records:
        for dtype in (torch.float16, torch.bfloat16):
            for gs in (128, 32, k):
                g = -(-k // gs)
                s = torch.rand(g, n).to(dtype)
                # plane-packed words (the loader's default for fp16, groups of 128k)
                packed = (False, True) if dtype == torch.float16 and gs % 128 == 0 else (False,)
                for m in (1, 2, 3, 8, 16, 33, 64, 200):
                    for integer_zeros in (False, True) if m <= 2 else (False,):
                        for planes in packed:
                            w4.w4a16_matmul(torch.randn(m, k).to(dtype), qw, s, s.clone(), gs,
                                            integer_zeros=integer_zeros, planes_packed=planes)
    _assert_fits(records, T4_SHARED_LIMIT if arch < 80 else SHARED_LIMIT)
    # every config of an fp16 / bf16 row of the mma.sync table for this N was compiled (the
    # fp32 rows serve the interpreter only: kernels.w4a16_matmul sends fp32 to the reference)
    rows = {(r.act, r.config) for r in wc.TABLES["mma_sync"]
            if r.act != "fp32" and r.n[0] <= n <= r.n[1]}
    assert rows <= set(chosen), rows - set(chosen)
    if arch < 80:  # Turing (the T4 of cloud instances): no cp.async (sm_80+), and Triton may
        return     # lower these dots without mma.sync; compiling and fitting is checked
    # packed words, one row: x read as int32 words staged by cp.async (PLANES)
    assert any("gemv16" in name and kw.get("PLANES") and "cp.async" in kern.asm["ptx"]
               for name, kw, kern in records)
    # the one-row GEMV's loads staged through shared memory
    assert any(kw.get("PIPE", 0) > 0 and "cp.async" in kern.asm["ptx"]
               for _name, kw, kern in records)
    # 3-16 rows on sm_8x: the plane dots with x split in registers, on mma.sync
    assert any(kw.get("X_SPLIT") and "mma.sync" in kern.asm["ptx"]
               for _name, kw, kern in records)
    # 17-64 rows: the plane dots over x in plane order, 64-row tiles at 33 and 64 rows
    assert any(kw.get("X_PLANES") and kw.get("BLOCK_M") == 64 and "mma.sync" in kern.asm["ptx"]
               for _name, kw, kern in records)


@pytest.mark.parametrize("arch", [75, 89, 120])
def test_attention_configs_fit(arch):
    with compile_only(arch) as records:
        for dtype, d, h, hkv, bs in ((torch.float16, 128, 32, 8, 16),
                                     (torch.bfloat16, 128, 32, 4, 16),
                                     (torch.float16, 64, 9, 3, 32),
                                     (torch.float16, 128, 28, 4, 8)):
            kc = torch.randn(64, bs, hkv, d).to(dtype)
            table = torch.randint(0, 64, (4, 64 // 4), dtype=torch.int32)
            sl = torch.full((4,), 200, dtype=torch.int32)
            q = torch.randn(4, h, d).to(dtype)
            pa.paged_decode(q, kc, kc, table, sl, 0.1, max_seq_len=200)  # split + reduce
            pa.paged_decode(q, kc, kc, table, sl, 0.1, max_seq_len=200,
                            config=pa.DecodeConfig(num_splits=1))
            qsl = torch.tensor([0, 100, 150, 151, 200], dtype=torch.int32)
            pa.paged_prefill(torch.randn(200, h, d).to(dtype), kc, kc, table, qsl, sl, 0.1)
            # keys split per q tile, merged by a second launch (a few queries, long context)
            pa.paged_prefill(torch.randn(8, h, d).to(dtype), kc, kc, table[:1],
                             torch.tensor([0, 8], dtype=torch.int32), sl[:1], 0.1,
                             pa.PrefillConfig(num_splits=4))
            pa.write_kv(torch.randn(5, hkv, d).to(dtype), torch.randn(5, hkv, d).to(dtype),
                        kc, kc.clone(), torch.arange(5))
    _assert_fits(records, T4_SHARED_LIMIT if arch < 80 else SHARED_LIMIT)
    assert any(name == "_paged_prefill_kernel" and kw.get("SPLIT") for name, kw, _ in records)


def test_decode_register_cap_only_where_splits_are_summed_in_the_kernel():
    """The decode launch that sums its splits in the kernel is capped at 128 registers
    (DecodeConfig.max_registers: Triton 3.6 gave it 158 on sm_90, two waves where one fit);
    one split, or the sum in a second launch, is not capped."""
    kc = torch.randn(64, 16, 8, 128).half()
    table = torch.randint(0, 64, (4, 16), dtype=torch.int32)
    sl = torch.full((4,), 200, dtype=torch.int32)
    q = torch.randn(4, 32, 128).half()
    caps = {}
    for name, cfg in (("fused", pa.DecodeConfig(num_splits=2)),
                      ("one split", pa.DecodeConfig(num_splits=1)),
                      ("second launch", pa.DecodeConfig(num_splits=2, fused_reduce=False))):
        with compile_only(ARCH) as records:
            pa.paged_decode(q, kc, kc, table, sl, 0.1, max_seq_len=200, config=cfg)
        kern = next(k for n, _, k in records if n == "_paged_decode_kernel")
        caps[name] = ".maxnreg 128" in kern.asm["ptx"]
    assert caps == {"fused": True, "one split": False, "second launch": False}


@pytest.mark.parametrize("arch", [86, 89, 120])
def test_fp8_kv_configs_compile(arch, monkeypatch):
    """The fp8 KV cache (uint8 codes, kernels/kv_fp8.py): the K/V writes and both attention
    kernels compile for the 3090, the 4090 and the 5090 and fit the shared-memory limit. On sm_86
    the codes are decoded with integer and fp32 math (no cvt from e4m3, which sm_86 lacks);
    on sm_89 and sm_120 (as ``has_fp8_cvt`` would say of a 4090 or 5090) the attention
    kernels use the hardware conversion."""
    pc = importlib.import_module("edge_llm.kernels.paged_common")
    rkv = importlib.import_module("edge_llm.kernels.rotary_kv")
    monkeypatch.setattr(pc, "has_fp8_cvt", lambda device: arch >= 89)
    with compile_only(arch) as records:
        for dtype, d, h, hkv in ((torch.float16, 128, 32, 8), (torch.bfloat16, 128, 28, 4)):
            kc = torch.zeros(64, 16, hkv, d, dtype=torch.uint8)
            table = torch.randint(0, 64, (4, 16), dtype=torch.int32)
            sl = torch.full((4,), 200, dtype=torch.int32)
            pa.paged_decode(torch.randn(4, h, d).to(dtype), kc, kc, table, sl, 0.1,
                            max_seq_len=200)
            qsl = torch.tensor([0, 100, 150, 151, 200], dtype=torch.int32)
            pa.paged_prefill(torch.randn(200, h, d).to(dtype), kc, kc, table, qsl, sl, 0.1)
            k = torch.randn(5, hkv, d).to(dtype)
            pa.write_kv(k, k.clone(), kc, kc.clone(), torch.arange(5))
            cos = torch.randn(4096, d // 2)
            rkv.rotary_write_kv(torch.randn(5, h, d).to(dtype), k, k.clone(), cos, cos.clone(),
                                torch.arange(5), kc, kc.clone(), torch.arange(5))
    _assert_fits(records)
    attention = [kern for name, _, kern in records if "paged" in name]
    assert len(attention) == 4
    for name, _, kern in records:
        if arch < 89 or kern not in attention:
            assert "e4m3" not in kern.asm["ptx"], name
        else:
            assert "cvt.rn.f16x2.e4m3x2" in kern.asm["ptx"], name


@pytest.mark.parametrize("hidden,inter,h,hkv,d", [(4096, 11008, 32, 32, 128),
                                                  (3584, 18944, 28, 4, 128),
                                                  (576, 1536, 9, 3, 64)])
def test_fused_configs_fit(hidden, inter, h, hkv, d):
    """Llama-2-7B, Qwen2.5-7B and SmolLM2-135M decoder shapes: norms (and qk-norm rows of one
    head), SiLU-and-mul, rotary at 1, 37 and 256 rows, which must share one build per kernel
    and constants (no variant per row count left to compile while serving)."""
    cos = torch.randn(4096, d // 2)
    with compile_only(ARCH) as records:
        for dtype in (torch.float16, torch.bfloat16):
            w = torch.randn(hidden).to(dtype)
            for m in (1, 37, 256):
                x = torch.randn(m, hidden).to(dtype)
                fu.rms_norm(x, w, 1e-6)
                fu.add_rms_norm(x, x.clone(), w, 1e-6)
                fu.silu_and_mul(torch.randn(m, inter).to(dtype), torch.randn(m, inter).to(dtype))
                rot.rotary(torch.randn(m, h, d).to(dtype), torch.randn(m, hkv, d).to(dtype), cos,
                          cos.clone(), torch.randint(0, 4096, (m,)))
            fu.rms_norm(torch.randn(37, h, d).to(dtype), torch.randn(d).to(dtype), 1e-6)
    assert {name for name, _, _ in records} == {"_rms_norm_kernel", "_silu_mul_kernel",
                                                "_rotary_kernel"}
    specialisations: dict[str, set[str]] = {}  # Triton's cache key: signature + arg attributes
    for name, kwargs, kern in records:
        key = str((name, sorted((k, str(v)) for k, v in kwargs.items()), kern.src.signature))
        specialisations.setdefault(key, set()).add(str(kern.src.attrs))
    assert all(len(v) == 1 for v in specialisations.values()), "specialised on the row count"
    _assert_fits(records)


@pytest.mark.parametrize("arch", [86, 89, 120])
def test_w4a16_folded_zero_points_compile(arch):
    """The one-row GEMV with the zero point folded into the PTX constants (1-2 rows; 3-4
    rows subtract it) compiles (ptxas checks the inline PTX) and fits for 1-4 rows; per word
    the folded PTX has 2 fp16x2 subtractions where
    the same tile with the zero subtracted per word has 6 (kernels/w4a16_gemv_ptx.py's asm_text:
    the bias removal's two subtractions and two FMAs stay, the four zero subtractions go)."""
    k, n, gs = 4096, 4608, 128
    qw = torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int32)
    s = torch.rand(k // gs, n).half()
    subs = {}
    for fold in (False, True):
        with compile_only(arch) as records:
            for m in (1, 2, 3, 4):
                cfg = wc.Gemv16(block_n=128, block_k=128, rows=m, fold_zero=fold,
                                flat_scales=True, waves=2.5, min_k_tiles=1)
                w4.w4a16_matmul(torch.randn(m, k).half(), qw, s, s.clone(), gs, config=cfg,
                                integer_zeros=True)
        _assert_fits(records)
        kern = next(kn for name, kw, kn in records if kw.get("ROWS") == 1)
        assert kern.asm.get("cubin"), "no cubin: ptxas did not run"
        ptx = kern.asm["ptx"]
        subs[fold] = (ptx.count("sub.f16x2"), ptx.count("lop3.b32"))
    (sub_plain, lop_plain), (sub_fold, lop_fold) = subs[False], subs[True]
    assert lop_fold == lop_plain > 0  # the same words unpacked
    assert sub_fold * 3 == sub_plain, subs


@pytest.mark.parametrize("sms", [8, 132])
@pytest.mark.parametrize("arch", [86, 89, 90])
def test_gemv_silu_epilogue_leaves_the_loop_alone(arch, sms, monkeypatch):
    """The one-row GEMV with silu(gate) * up in its epilogue (``silu_mul=True``, SILU),
    dispatched for a 7B gate/up projection at 1 and 2 rows, plane-packed words or not:
    compiled by ptxas, it reads the weights with the same 16-byte loads (cp.async copies in
    the staged loop; plain loads into the register ring, which one row takes where the grid
    fits: 132 multiprocessors, not 8) and unpacks the same words as the plain launch (each
    program's columns come in two contiguous halves, gate and up, so the loads keep their
    width); only the epilogue adds an exponential."""
    monkeypatch.setattr(importlib.import_module("edge_llm.kernels.w4a16_gemv"), "num_sms",
                        lambda device: sms)
    k, n, gs = 4096, 22016, 128
    qw = torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int32)
    s = torch.rand(k // gs, n).half()
    for m in (1, 2):
        for planes in (False, True):
            ptx = {}
            for silu in (False, True):
                with compile_only(arch) as records:
                    w4.w4a16_matmul(torch.randn(m, k).half(), qw, s, s.clone(), gs,
                                    integer_zeros=True, planes_packed=planes, silu_mul=silu)
                _assert_fits(records)
                assert [(name, kw.get("SILU")) for name, kw, _ in records] == [
                    ("_w4a16_gemv16_kernel", silu)]
                assert records[0][2].asm.get("cubin"), "no cubin: ptxas did not run"
                ptx[silu] = records[0][2].asm["ptx"]
                ring = records[0][1]["RING"]
            assert ring == (m == 1 and sms == 132)
            if ring:
                copies = [re.findall(r"ld\.global\.v4\.b32", ptx[silu]) for silu in (False, True)]
                assert "cp.async" not in ptx[False] + ptx[True]
                assert copies[0] == copies[1] and copies[0], copies
            else:
                copies = [re.findall(r"cp\.async\.cg\.shared\.global.*, (0x[0-9a-f]+|\d+)",
                                     ptx[silu]) for silu in (False, True)]
                assert copies[0] == copies[1] and set(copies[0]) == {"0x10"}, copies
            assert ptx[False].count("lop3.b32") > 0
            for op in ("lop3.b32", "fma.rn.f16x2", "ld.global"):
                assert ptx[False].count(op) == ptx[True].count(op), (op, m, planes)
            assert "ex2.approx" in ptx[True] and "ex2.approx" not in ptx[False]


ALL_KERNELS = {
    "_rms_norm_kernel", "_silu_mul_kernel", "_rotary_kernel", "_rotary_write_kv_kernel",
    "_write_kv_kernel", "_paged_decode_kernel", "_paged_decode_reduce_kernel",
    "_paged_prefill_kernel", "_merge_partitions_kernel", "_w4a16_gemv16_kernel",
    "_w4a16_gemv_kernel", "_w4a16_dot_kernel",
    "_w4a16_swap_kernel", "_splitk_reduce_kernel", "_dequant_kernel", "_gather_cols_kernel",
}


def _launch_every_kernel(monkeypatch) -> None:
    """One launch (or more) of each of ``ALL_KERNELS`` through its wrapper, on CPU tensors."""
    monkeypatch.setattr(torch, "matmul", lambda a, b: a.new_zeros(a.shape[0], b.shape[1]))
    rkv = importlib.import_module("edge_llm.kernels.rotary_kv")
    ga = importlib.import_module("edge_llm.kernels.gather")
    k, n, gs = 4096, 4608, 128
    qw = torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int32)
    for dtype, rows in ((torch.float16, (1, 2, 8, 33, 200)), (torch.bfloat16, (8, 33)),
                        (torch.float32, (1,))):
        s = torch.rand(k // gs, n).to(dtype)
        for m in rows:
            w4.w4a16_matmul(torch.randn(m, k).to(dtype), qw, s, s.clone(), gs,
                            integer_zeros=True, planes_packed=dtype == torch.float16)
    s = torch.rand(k // gs, n)
    w4.w4a16_matmul(torch.randn(1, k), qw, s, s.clone(), gs,  # split K summed in a 2nd launch
                    config=wc.Gemv(block_n=128, block_k=64, split_k=4))
    d, h, hkv = 128, 32, 8
    kc = torch.randn(64, 16, hkv, d).half()
    table = torch.randint(0, 64, (4, 16), dtype=torch.int32)
    sl = torch.full((4,), 200, dtype=torch.int32)
    q = torch.randn(4, h, d).half()
    pa.paged_decode(q, kc, kc, table, sl, 0.1, max_seq_len=200)
    pa.paged_decode(q, kc, kc, table, sl, 0.1, max_seq_len=200,
                    config=pa.DecodeConfig(num_splits=2, fused_reduce=False))
    qsl = torch.tensor([0, 100, 150, 151, 200], dtype=torch.int32)
    pa.paged_prefill(torch.randn(200, h, d).half(), kc, kc, table, qsl, sl, 0.1)
    pa.paged_prefill(torch.randn(8, h, d).half(), kc, kc, table[:1],  # keys split, merged
                     torch.tensor([0, 8], dtype=torch.int32), sl[:1], 0.1,
                     pa.PrefillConfig(num_splits=2))
    kv = torch.randn(5, hkv, d).half()
    pa.write_kv(kv, kv.clone(), kc, kc.clone(), torch.arange(5))
    cos = torch.randn(4096, d // 2)
    rkv.rotary_write_kv(torch.randn(5, h, d).half(), kv, kv.clone(), cos, cos.clone(),
                        torch.arange(5), kc, kc.clone(), torch.arange(5))
    x, w = torch.randn(3, 4096).half(), torch.randn(4096).half()
    fu.rms_norm(x, w, 1e-6)
    fu.add_rms_norm(x, x.clone(), w, 1e-6)
    fu.silu_and_mul(torch.randn(3, 11008).half(), torch.randn(3, 11008).half())
    rot.rotary(torch.randn(3, h, d).half(), torch.randn(3, hkv, d).half(), cos, cos.clone(),
              torch.arange(3))
    ga.gather_columns(x, torch.randperm(4096))


@pytest.mark.parametrize("on", [True, False])
def test_pdl_every_kernel_waits_before_it_reads(on, monkeypatch):
    """With programmatic dependent launch on (kernels/pdl.py, Hopper), every kernel we launch
    is built with ``launch_pdl`` and its PTX waits on the previous grid
    (``griddepcontrol.wait``) and lets the next one launch; off, neither appears. A kernel
    launched early without the wait would read its inputs before they are written. (Decode
    attention's L2 prefetch, on by default, reads before its wait what no kernel writes:
    tests/test_prefetch_compile.py checks that; it is off here, and so are the one-row GEMV's
    weight tile and the rotary kernel's tables read before their waits, checked there too, as
    is RMSNorm's weight, which has no switch: here only what follows its wait is looked at.)"""
    pdl = importlib.import_module("edge_llm.kernels.pdl")
    monkeypatch.setattr(pdl, "pdl_on", lambda device: on)
    monkeypatch.setattr(importlib.import_module("edge_llm.kernels.paged_decode"),
                        "PREFETCH_TILES", 0)
    monkeypatch.setattr(importlib.import_module("edge_llm.kernels.w4a16_gemv"),
                        "EARLY_ROWS", 0)
    monkeypatch.setattr(importlib.import_module("edge_llm.kernels.rotary_kv"),
                        "EARLY_TABLES", False)
    with compile_only(90) as records:
        _launch_every_kernel(monkeypatch)
    assert {name for name, _, _ in records} == ALL_KERNELS
    for name, _, kern in records:
        ptx = kern.asm["ptx"]
        assert kern.metadata.launch_pdl is on, name
        assert ("griddepcontrol.wait" in ptx) is on, name
        assert ("griddepcontrol.launch_dependents" in ptx) is on, name
        if on:  # the wait comes before the kernel's first global or shared memory access
            wait = ptx.index("griddepcontrol.wait")
            if name == "_rms_norm_kernel":  # its weight before the wait: test_prefetch_compile
                ptx, wait = ptx[wait:], 0
            first = re.search(r"\b(ld|st|cp\.async|atom|red)\.(global|shared)", ptx)
            assert first and wait < first.start(), name


@pytest.mark.parametrize("arch,cache", [(86, torch.float16), (89, torch.uint8)])
def test_head_dim_256_window_softcap_fit(arch, cache, monkeypatch):
    """Gemma 2 / 3's head_dim 256 (Gemma-2-9B: 16 query and 8 kv heads) with a sliding
    window and soft-capped scores: decode (its splits summed in the kernel), prefill (keys
    split and not), the K/V write with rotary and the GeLU MLP, on the 3090 with an fp16
    cache and the 4090 with an fp8 one, within their 99 KB of shared memory. Prefill takes
    its head_dim-256 config (paged_prefill.default_prefill_config), decode its defaults."""
    pc = importlib.import_module("edge_llm.kernels.paged_common")
    rkv = importlib.import_module("edge_llm.kernels.rotary_kv")
    monkeypatch.setattr(pc, "has_fp8_cvt", lambda device: arch >= 89)
    d, h, hkv = 256, 16, 8
    kc = torch.zeros(64, 16, hkv, d, dtype=cache)
    vc = torch.zeros_like(kc)
    table = torch.randint(0, 64, (4, 16), dtype=torch.int32)
    sl = torch.full((4,), 200, dtype=torch.int32)
    q = torch.randn(4, h, d).half()
    kw = dict(window=64, softcap=50.0)
    with compile_only(arch) as records:
        pa.paged_decode(q, kc, vc, table, sl, 0.1, max_seq_len=1000, **kw)
        qsl = torch.tensor([0, 100, 150, 151, 200], dtype=torch.int32)
        pa.paged_prefill(torch.randn(200, h, d).half(), kc, vc, table, qsl, sl, 0.1, **kw)
        pa.paged_prefill(torch.randn(8, h, d).half(), kc, vc, table[:1],
                         torch.tensor([0, 8], dtype=torch.int32), sl[:1], 0.1,
                         pa.PrefillConfig(block_n=32, num_splits=4), **kw)
        k = torch.randn(5, hkv, d).half()
        cos = torch.randn(4096, d // 2)
        rkv.rotary_write_kv(torch.randn(5, h, d).half(), k, k.clone(), cos, cos.clone(),
                            torch.arange(5), kc, vc, torch.arange(5))
        fu.silu_and_mul(torch.randn(3, 14336).half(), torch.randn(3, 14336).half(), gelu=True)
    _assert_fits(records)
    assert {name for name, _, _ in records} == {
        "_paged_decode_kernel", "_paged_prefill_kernel",
        "_merge_partitions_kernel", "_rotary_write_kv_kernel", "_silu_mul_kernel"}
    for name, kw_, kern in records:
        if name in ("_paged_decode_kernel", "_paged_prefill_kernel"):
            assert kw_["HEAD_DIM"] == 256 and kw_["WINDOW"] and kw_["SOFTCAP"]
            assert "mma.sync" in kern.asm["ptx"], name
    assert [kw_["BLOCK_N"] for name, kw_, _ in records if name == "_paged_prefill_kernel"] == [
        32, 32]
