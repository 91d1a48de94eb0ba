"""Triton kernels at full size on a CUDA GPU against their torch references (``pytest -m gpu``).

Every test also checks the shared memory of each kernel compiled so far (its metadata) against
the 99 KB per block that sm_86/sm_89 (RTX 3090/4090) allow.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import importlib  # noqa: E402

from edge_llm import kernels  # noqa: E402

# by module path: the package attribute ``paged_attention`` is the dispatch function
pa = importlib.import_module("edge_llm.kernels.paged_attention")
w4 = importlib.import_module("edge_llm.kernels.w4a16")
wc = importlib.import_module("edge_llm.kernels.w4a16_config")

DEV = torch.device("cuda")
SHARED_LIMIT = 99 * 1024
SHAPES = [(4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096),
          (3584, 4608), (3584, 3584), (3584, 37888), (18944, 3584)]
MS = [1, 2, 3, 8, 16, 33, 64, 128, 256, 1024]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert bool(torch.isfinite(out).all()), "non-finite output"
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def _compiled_kernels() -> dict[tuple[str, str], object]:
    found = {}
    for mod in (w4, pa):
        for name in dir(mod):
            caches = getattr(getattr(mod, name), "device_caches", None)
            for cache in (caches or {}).values():
                for key, kern in cache[0].items():
                    found[(name, str(key))] = kern
    return found


@pytest.fixture(autouse=True)
def shared_memory_fits():
    """Kernels compiled during the test fit 99 KB of shared memory (metadata of the build
    for this GPU; tests/test_kernels_compile.py checks the sm_86/sm_89 builds)."""
    before = set(_compiled_kernels())
    yield
    for (name, _), kern in _compiled_kernels().items():
        if (name, _) in before:
            continue
        shared = int(kern.metadata.shared)
        assert shared <= SHARED_LIMIT, f"{name} uses {shared} B of shared memory"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k,n", SHAPES)
def test_w4a16_full_shapes(k, n, dtype):
    gs = 128
    q = torch.randint(0, 16, (k, n), device=DEV)
    qw = w4.pack_w4_ref(q)
    s = (torch.rand(k // gs, n, device=DEV) * 0.02 + 0.001).to(dtype)
    z = torch.randint(0, 16, (k // gs, n), device=DEV).to(dtype)
    w = w4.dequantize_w4a16_ref(qw, s, z, gs)  # (K, N) fp32
    for m in MS:
        x = torch.randn(m, k, device=DEV, dtype=dtype)
        y = kernels.w4a16_matmul(x, qw, s, z, gs)
        assert y.dtype == dtype and y.shape == (m, n)
        err = rel_err(y, x.float() @ w)
        assert err < 1e-2, f"M={m}: rel err {err:.2e}"


@pytest.mark.parametrize("gs", [32, 64, 4096])
def test_w4a16_group_sizes_and_splits(gs):
    k, n = 4096, 4608
    qw = w4.pack_w4_ref(torch.randint(0, 16, (k, n), device=DEV))
    g = -(-k // gs)
    s = (torch.rand(g, n, device=DEV) * 0.02 + 0.001).half()
    z = (torch.rand(g, n, device=DEV) * 15).half()  # non-integer zero points too
    w = w4.dequantize_w4a16_ref(qw, s, z, gs)
    for m, cfg in [(1, None), (1, wc.Gemv(block_n=128, block_k=64, split_k=3)), (5, None),
                   (16, wc.Dot(block_m=16, block_n=64, block_k=128, split_k=5)),
                   (9, wc.Dot(block_m=16, block_n=64, block_k=256, split_k=3, nibble_dots=True)),
                   (200, None),
                   (64, wc.Dequant()),
                   (3, wc.Gemv16(block_n=128, block_k=128, split_k=3, rows=2)),
                   (7, wc.Gemv16(block_n=64, block_k=256, split_k=1, rows=4)),
                   (13, wc.Gemv16(block_n=64, block_k=128, split_k=1, rows=3)),
                   (1, wc.Gemv16(block_n=32, block_k=128, rows=1))]:
        x = torch.randn(m, k, device=DEV, dtype=torch.float16)
        err = rel_err(w4.w4a16_matmul(x, qw, s, z, gs, config=cfg), x.float() @ w)
        assert err < 1e-2, f"gs={gs} M={m} {cfg}: rel err {err:.2e}"


def _paged(b, ctx_lens, hkv, d, bs, dtype):
    nblk = [-(-c // bs) for c in ctx_lens]
    total = sum(nblk) + 7
    perm = torch.randperm(total, device=DEV).to(torch.int32)
    table = torch.full((b, max(nblk) + 2), int(perm[-1]), device=DEV, dtype=torch.int32)
    start = 0
    for i, used in enumerate(nblk):
        table[i, :used] = perm[start:start + used]
        start += used
    kc = torch.randn(total, bs, hkv, d, device=DEV, dtype=dtype)
    vc = torch.randn_like(kc)
    return kc, vc, table


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hkv", [8, 4])  # 32 query heads: GQA 4 and 8
def test_decode_32x2048(hkv, dtype):
    b, ctx, h, d, bs = 32, 2048, 32, 128, 16
    lens = [ctx - (i * 37) % 50 for i in range(b)]  # partial last blocks
    kc, vc, table = _paged(b, lens, hkv, d, bs, dtype)
    q = torch.randn(b, h, d, device=DEV, dtype=dtype)
    seq_lens = torch.tensor(lens, device=DEV, dtype=torch.int32)
    qsl = torch.arange(b + 1, dtype=torch.int32)
    ref = pa.paged_attention_ref(q, kc, vc, table, qsl, seq_lens, d ** -0.5)
    for cfg in [None, pa.DecodeConfig(num_splits=1), pa.DecodeConfig(block_n=32, num_splits=5)]:
        out = pa.paged_decode(q, kc, vc, table, seq_lens, d ** -0.5, ctx, cfg)
        assert rel_err(out, ref) < 1e-2, cfg
    out = kernels.paged_attention(q, kc, vc, table, qsl.to(DEV), seq_lens, d ** -0.5)
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_chunked_prefill_and_mixed_batch(dtype):
    hkv, h, d, bs = 4, 28, 128, 16
    nq = [700, 1, 1, 130, 1024, 3]
    ctx = [2000, 61, 3000, 130, 1024, 900]
    kc, vc, table = _paged(len(nq), ctx, hkv, d, bs, dtype)
    t = sum(nq)
    q = torch.randn(t, h, d, device=DEV, dtype=dtype)
    qsl = torch.tensor([0] + nq).cumsum(0).to(torch.int32)
    sl = torch.tensor(ctx, device=DEV, dtype=torch.int32)
    ref = pa.paged_attention_ref(q, kc, vc, table, qsl, sl, 0.1)
    assert rel_err(kernels.paged_attention(q, kc, vc, table, qsl, sl, 0.1), ref) < 1e-2
    assert rel_err(kernels.paged_attention(q, kc, vc, table, qsl.to(DEV), sl, 0.1), ref) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemma_head_dim_256_window_softcap(dtype):
    """Gemma-2-9B's attention (16 / 8 heads, head_dim 256, window 4096, scores capped at 50)
    at contexts past the window: decode of 16 sequences (split and not) and a mixed prefill
    step, against the reference; and the same without a window (its full-attention layers)."""
    hkv, h, d, bs, window = 8, 16, 256, 16, 4096
    scale = 256 ** -0.5
    lens = [6000 - 97 * i for i in range(16)]
    kc, vc, table = _paged(16, lens, hkv, d, bs, dtype)
    q = torch.randn(16, h, d, device=DEV, dtype=dtype)
    seq_lens = torch.tensor(lens, device=DEV, dtype=torch.int32)
    qsl = torch.arange(17, dtype=torch.int32)
    for win in (window, None):
        kw = dict(window=win, softcap=50.0)
        ref = pa.paged_attention_ref(q, kc, vc, table, qsl, seq_lens, scale, **kw)
        for cfg in [None, pa.DecodeConfig(num_splits=1), pa.DecodeConfig(num_splits=5)]:
            out = pa.paged_decode(q, kc, vc, table, seq_lens, scale, 8192, cfg, **kw)
            assert rel_err(out, ref) < 1e-2, (win, cfg)
    nq, ctx = [700, 1, 1, 300, 5000], [5000, 4097, 30, 300, 5000]
    kc, vc, table = _paged(len(nq), ctx, hkv, d, bs, dtype)
    qp = torch.randn(sum(nq), h, d, device=DEV, dtype=dtype)
    qsl = torch.tensor([0] + nq).cumsum(0).to(torch.int32)
    sl = torch.tensor(ctx, device=DEV, dtype=torch.int32)
    for win in (window, None):
        kw = dict(window=win, softcap=50.0)
        ref = pa.paged_attention_ref(qp, kc, vc, table, qsl, sl, scale, **kw)
        out = kernels.paged_attention(qp, kc, vc, table, qsl, sl, scale, **kw)
        assert rel_err(out, ref) < 1e-2, win


def test_write_kv_cuda():
    kc = torch.randn(50, 16, 8, 128, device=DEV, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    k = torch.randn(300, 8, 128, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    slots = torch.randperm(800, device=DEV)[:300]
    slots[::7] = -1
    kernels.write_kv(k, v, kc, vc, slots)
    pa.write_kv_ref(k, v, kc_ref, vc_ref, slots)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_w4a16_gemv16_large_activations(dtype):
    """fp16 partial sums in the PTX: activations with outliers of a few hundred (as in the
    inputs of down projections) stay finite and accurate."""
    k, n, gs = 11008, 4096, 128
    qw = w4.pack_w4_ref(torch.randint(0, 16, (k, n), device=DEV))
    s = (torch.rand(k // gs, n, device=DEV) * 0.02 + 0.001).to(dtype)
    z = torch.randint(0, 16, (k // gs, n), device=DEV).to(dtype)
    w = w4.dequantize_w4a16_ref(qw, s, z, gs)
    for m in (1, 4, 16):
        x = torch.randn(m, k, device=DEV, dtype=dtype)
        idx = torch.randint(0, k, (m, 8), device=DEV)
        x.scatter_(1, idx, torch.randn(m, 8, device=DEV, dtype=dtype).sign() * 600)
        y = kernels.w4a16_matmul(x, qw, s, z, gs)
        err = rel_err(y, x.float() @ w)
        assert err < 1e-2, f"M={m} {dtype}: rel err {err:.2e}"


@pytest.mark.parametrize("gs", [32, 128])
def test_w4a16_gemv16_folded_zero_points(gs):
    """The zero point folded into the PTX's bias constants (integer zero points, as every
    checkpoint has; K tiles inside one group), with flat scale rows and without: 1-4 rows,
    split K summed in the kernel and by a second launch, activations with outliers of 600
    included."""
    k, n = 4096, 4608
    qw = w4.pack_w4_ref(torch.randint(0, 16, (k, n), device=DEV))
    s = (torch.rand(k // gs, n, device=DEV) * 0.02 + 0.001).half()
    z = torch.randint(0, 17, (k // gs, n), device=DEV).half()
    w = w4.dequantize_w4a16_ref(qw, s, z, gs)
    for m in (1, 2, 3, 4):
        for bn, split, fused, flat in ((128, 0, True, True), (64, 3, False, True),
                                       (256, 1, True, True), (128, 0, True, False)):
            cfg = wc.Gemv16(block_n=bn, block_k=min(gs, 128), split_k=split, rows=m,
                            fold_zero=True, flat_scales=flat, waves=2.5, min_k_tiles=1,
                            fused_reduce=fused)
            x = torch.randn(m, k, device=DEV, dtype=torch.float16)
            if bn == 256:
                idx = torch.randint(0, k, (m, 8), device=DEV)
                x.scatter_(1, idx, torch.randn(m, 8, device=DEV).sign().half() * 600)
            y = w4.w4a16_matmul(x, qw, s, z, gs, config=cfg, integer_zeros=True)
            err = rel_err(y, x.float() @ w)
            assert err < 1e-2, f"gs={gs} M={m} {cfg}: rel err {err:.2e}"


@pytest.mark.parametrize("k,n,gs", [(4096, 12288, 128), (11008, 4096, 128), (3584, 4608, 64)])
def test_w4a16_gemv16_staged_loads(k, n, gs):
    """The tile loads staged through shared memory (pipe_stages: cp.async, tl.range's
    pipeliner) against the reference at full size: 1-4 rows, 2-6 stages, K split and summed
    in the kernel or by a second launch, per-row and per-tile scales, folded zero points."""
    qw = w4.pack_w4_ref(torch.randint(0, 16, (k, n), device=DEV))
    s = (torch.rand(k // gs, n, device=DEV) * 0.02 + 0.001).half()
    z = torch.randint(0, 17, (k // gs, n), device=DEV).half()
    w = w4.dequantize_w4a16_ref(qw, s, z, gs)
    cases = ((32, 512, 0, 2, False, True), (32, 512, 0, 4, False, False),
             (64, 256, 3, 6, False, True), (128, 128, 0, 4, True, True))
    for m in (1, 2, 3, 4):
        for bn, bk, split, pipe, flat, fused in cases:
            cfg = wc.Gemv16(block_n=bn, block_k=bk, split_k=split, rows=m, fold_zero=flat,
                            flat_scales=flat, pipe_stages=pipe, waves=2.5, min_k_tiles=1,
                            fused_reduce=fused)
            x = torch.randn(m, k, device=DEV, dtype=torch.float16)
            y = w4.w4a16_matmul(x, qw, s, z, gs, config=cfg, integer_zeros=True)
            err = rel_err(y, x.float() @ w)
            assert err < 1e-2, f"k={k} n={n} M={m} {cfg}: rel err {err:.2e}"


@pytest.mark.parametrize("k,n", [(4096, 4608), (4160, 4608), (1088, 320)])
def test_w4a16_one_row_dispatch(k, n):
    """The dispatched 1-2 row tile at groups of 128 (one-group K tiles, flat scales, staged
    loads): zero points folded when vouched for as integers, subtracted otherwise (fractional
    zero points then stay exact); K a whole number of tiles or not (4,160 and 1,088 end in
    half a group), N not a multiple of the tile."""
    gs = 128
    g = -(-k // gs)
    qw = w4.pack_w4_ref(torch.randint(0, 16, (k, n), device=DEV))
    s = (torch.rand(g, n, device=DEV) * 0.02 + 0.001).half()
    for integer_zeros in (True, False):
        z = (torch.randint(0, 17, (g, n), device=DEV) if integer_zeros
             else torch.rand(g, n, device=DEV) * 15).half()
        w = w4.dequantize_w4a16_ref(qw, s, z, gs)
        for m in (1, 2):
            cfg = wc.lookup("wgmma", "fp16", m, n, k, gs)  # and on mma.sync: the same row
            assert cfg.pipe_stages == 4 and cfg.fold_zero  # folded where vouched for
            x = torch.randn(m, k, device=DEV, dtype=torch.float16)
            y = w4.w4a16_matmul(x, qw, s, z, gs, integer_zeros=integer_zeros)
            err = rel_err(y, x.float() @ w)
            assert err < 1e-2, f"k={k} n={n} M={m} integer_zeros={integer_zeros}: {err:.2e}"


def test_dequant_path_reuses_one_buffer_and_is_capture_safe(monkeypatch):
    """Above 64 rows the weights are dequantized into one reused buffer: a smaller weight
    reuses it, results stay right; inside a CUDA graph capture with no buffer yet, the
    dequantization allocates into the graph's pool instead, and the replay is right."""
    dq = importlib.import_module("edge_llm.kernels.w4a16_dequant")
    monkeypatch.setattr(dq, "_SCRATCH", {})  # this test's own buffers
    monkeypatch.setattr(dq, "_CAPTURED", [False])
    gs, m = 128, 128

    def weights(k, n):
        qw = w4.pack_w4_ref(torch.randint(0, 16, (k, n), device=DEV))
        s = (torch.rand(k // gs, n, device=DEV) * 0.02 + 0.001).half()
        z = torch.randint(0, 16, (k // gs, n), device=DEV).half()
        return (qw, s, z), w4.dequantize_w4a16_ref(qw, s, z, gs)

    big, big_ref = weights(1024, 2048)
    small, small_ref = weights(1024, 512)
    x = torch.randn(m, 1024, device=DEV, dtype=torch.float16)
    y_big = kernels.w4a16_matmul(x, *big, gs)
    (key, buf), = dq._SCRATCH.items()
    y_small = kernels.w4a16_matmul(x, *small, gs)
    assert dq._SCRATCH[key] is buf, "a smaller weight reallocated the buffer"
    assert rel_err(y_big, x.float() @ big_ref) < 1e-2
    assert rel_err(y_small, x.float() @ small_ref) < 1e-2

    dq._SCRATCH.clear()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        y = kernels.w4a16_matmul(x, *big, gs)
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    assert not dq._SCRATCH, "the buffer was allocated inside a capture"
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(y, x.float() @ big_ref) < 1e-2


@pytest.mark.parametrize("k,n,gs", [(4096, 22016, 128), (3584, 37888, 128), (4160, 4608, 128),
                                    (4096, 4608, 32), (11008, 4096, 64)])
def test_w4a16_plane_dots_at_full_size(k, n, gs):
    """The plane dots on this GPU: x split into planes in registers (the
    mma.sync dispatch; here compiled for this GPU's MMA) and over x copied into plane order
    (Hopper's wide-N dispatch; K a whole number of tiles), against the fp32 product; ragged
    K, groups of 32-128, with a split summed in the kernel and without."""
    g = -(-k // gs)
    qw = w4.pack_w4_ref(torch.randint(0, 16, (k, n), device=DEV))
    s = (torch.rand(g, n, device=DEV) * 0.02 + 0.001).half()
    z = torch.randint(0, 16, (g, n), device=DEV).half()
    w = w4.dequantize_w4a16_ref(qw, s, z, gs)
    for m in (3, 16, 32):
        x = torch.randn(m, k, device=DEV, dtype=torch.float16)
        ref = x.float() @ w
        for split in (0, 1):
            cfgs = [wc.Swap(block_m=16 if m <= 16 else 32, split_k=split, waves=2.5,
                            min_k_tiles=1, fused_reduce=m <= 16, x_split=True)]
            if k % 128 == 0:
                cfgs.append(wc.Swap(block_m=16 if m <= 16 else 32, split_k=split,
                                    waves=2.5, min_k_tiles=1, x_planes=True))
            for cfg in cfgs:
                err = rel_err(w4.w4a16_matmul(x, qw, s, z, gs, config=cfg), ref)
                assert err < 1e-2, f"k={k} n={n} gs={gs} M={m} {cfg}: {err:.2e}"
    if k % 128 == 0 and n >= 16384 and torch.cuda.get_device_capability()[0] == 9:
        assert wc.lookup("wgmma", "fp16", 4, n, k, gs).x_planes  # dispatched here


def test_w4a16_mma_sync_dispatch_in_a_subprocess():
    """With DISABLE_MMA_V3=1 (Triton compiles dots for mma.sync, as on sm_8x) the dispatch
    takes the plane dots with x split in registers at 3-16 rows (over x in plane order at 3-8
    rows for 50M weights), and at 17-64 the plane dots over x in plane order (groups of 128)
    or the "dot" kernel (groups of 64), all right. A subprocess: Triton's in-memory kernel
    cache does not key on that variable."""
    code = """
import torch
from edge_llm.kernels import w4a16 as w4
dev = torch.device("cuda")
for k, n, gs in ((4096, 4096, 128), (3584, 4608, 64), (4096, 12288, 128)):
    qw = w4.pack_w4_ref(torch.randint(0, 16, (k, n), device=dev))
    s = (torch.rand(k // gs, n, device=dev) * 0.02 + 0.001).half()
    z = torch.randint(0, 16, (k // gs, n), device=dev).half()
    w = w4.dequantize_w4a16_ref(qw, s, z, gs)
    for m in (3, 8, 16, 17, 33, 64):
        x = torch.randn(m, k, device=dev, dtype=torch.float16)
        cfg = w4.prepare(x, qw, s, z, gs)[1]  # the mma.sync table here
        if m <= 16:
            assert cfg.x_planes if n == 12288 and m <= 8 else cfg.x_split, cfg
        else:
            assert cfg.x_planes if gs == 128 else type(cfg).__name__ == "Dot", cfg
        y = w4.w4a16_matmul(x, qw, s, z, gs, integer_zeros=True)
        ref = x.float() @ w
        err = float((y.double() - ref.double()).norm() / ref.double().norm())
        assert err < 1e-2, (k, n, gs, m, err)
print("ok")
"""
    _run_child(code, DISABLE_MMA_V3="1")


def _run_child(code: str, **env: str) -> None:
    """Run ``code`` in a fresh Python with ``env`` added (Triton's in-memory kernel cache
    does not key on DISABLE_MMA_V3); it must print "ok" last."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


_PLANES_CODE = """
import torch
from edge_llm.kernels import w4a16 as w4
dev = torch.device("cuda")
for k, n in ((4096, 12288), (11008, 4096), (3584, 37888)):
    gs = 128
    qw = w4.pack_w4_ref(torch.randint(0, 16, (k, n), device=dev))
    s = (torch.rand(k // gs, n, device=dev) * 0.02 + 0.001).half()
    z = torch.randint(0, 16, (k // gs, n), device=dev).half()
    w = w4.dequantize_w4a16_ref(qw, s, z, gs)
    words = w4.pack_planes_ref(qw)
    for m in (1, 2, 3, 8, 16, 24, 48, 64, 65, 128, 256):
        x = torch.randn(m, k, device=dev, dtype=torch.float16)
        ref = x.float() @ w
        for zeros_int in (True, False):
            y = w4.w4a16_matmul(x, words, s, z, gs, integer_zeros=zeros_int,
                                planes_packed=True)
            err = float((y.double() - ref.double()).norm() / ref.double().norm())
            assert err < 1e-2, (k, n, m, zeros_int, err)
print("ok")
"""


@pytest.mark.parametrize("mma_v3", ["default", "disabled"])
def test_w4a16_plane_packed_words_at_full_size(mma_v3):
    """Plane-packed words (pack_planes_ref) through the dispatch at 1-256 rows, on this GPU's
    MMA kind and on mma.sync (DISABLE_MMA_V3=1, a subprocess: Triton's in-memory kernel cache
    does not key on it), folded zero points or not, against the fp32 product of the standard
    words."""
    _run_child(_PLANES_CODE, **({"DISABLE_MMA_V3": "1"} if mma_v3 == "disabled" else {}))
