"""The torch references against naive definitions, the CPU dispatch, and input validation."""

from __future__ import annotations

import importlib
import math
from types import SimpleNamespace

import pytest
import torch

from edge_llm import kernels

# by module path: the package attribute ``paged_attention`` is the dispatch function
pa = importlib.import_module("edge_llm.kernels.paged_attention")
w4 = importlib.import_module("edge_llm.kernels.w4a16")
cfg_mod = importlib.import_module("edge_llm.kernels.w4a16_config")


def _naive_dequant(q: torch.Tensor, s: torch.Tensor, z: torch.Tensor, gs: int) -> torch.Tensor:
    k, n = q.shape
    w = torch.empty(k, n, dtype=torch.float64)
    for kk in range(k):
        g = kk // gs
        w[kk] = (q[kk].double() - z[g].double()) * s[g].double()
    return w


@pytest.mark.parametrize("k,n,gs", [(64, 24, 32), (96, 8, 40), (48, 16, 48)])
def test_w4a16_ref_matches_layout_definition(k, n, gs):
    q = torch.randint(0, 16, (k, n))
    qw = w4.pack_w4_ref(q)
    assert qw.shape == (k // 8, n) and qw.dtype == torch.int32
    # nibble j of word r is k = 8r + j (bit-level check of a few entries)
    for kk, nn in [(0, 0), (k - 1, n - 1), (13, n // 2)]:
        assert (int(qw[kk // 8, nn]) >> (4 * (kk % 8))) & 0xF == int(q[kk, nn])
    g = -(-k // gs)
    s = torch.rand(g, n) * 0.1 + 0.01
    z = torch.rand(g, n) * 15
    w = _naive_dequant(q, s, z, gs)
    assert torch.allclose(w4.dequantize_w4a16_ref(qw, s, z, gs).double(), w, atol=1e-5)
    x = torch.randn(5, k)
    y = w4.w4a16_matmul_ref(x, qw, s, z, gs)
    assert torch.allclose(y.double(), x.double() @ w, rtol=1e-4, atol=1e-4)


def test_pack_matches_quant_runtime_layout():
    """The layout QuantLinear produces is the one the kernels read."""
    packing = pytest.importorskip("edge_llm.quant.packing")
    q = torch.randint(0, 16, (64, 40))
    assert torch.equal(packing.pack_int4(q, dim=0), w4.pack_w4_ref(q))


def test_w4a16_input_errors_name_the_argument():
    qw = w4.pack_w4_ref(torch.randint(0, 16, (64, 8)))
    s, z, x = torch.rand(2, 8), torch.rand(2, 8), torch.randn(3, 64)
    with pytest.raises(ValueError, match="qweight"):
        w4.w4a16_matmul_ref(x, qw.float(), s, z, 32)
    with pytest.raises(ValueError, match="scales"):
        w4.w4a16_matmul_ref(x, qw, torch.rand(3, 8), z, 32)
    with pytest.raises(ValueError, match="zeros"):
        w4.w4a16_matmul_ref(x, qw, s, torch.rand(2, 9), 32)
    with pytest.raises(ValueError, match="x: last dim"):
        w4.w4a16_matmul_ref(torch.randn(3, 65), qw, s, z, 32)
    with pytest.raises(ValueError, match="group_size"):
        w4.w4a16_matmul_ref(x, qw, s, z, 0)
    with pytest.raises(ValueError, match="q: values"):
        w4.pack_w4_ref(torch.full((8, 2), 16))


def _pick(m, n, k, gs, fp16=True, half=True, mma_sync=False, planes_packed=False):
    """The table's config for a problem (kernels/w4a16_config.py)."""
    act = "fp16" if fp16 else "bf16" if half else "fp32"
    return cfg_mod.lookup("mma_sync" if mma_sync else "wgmma", act, m, n, k, gs, planes_packed)


def _block_m(cfg, m):
    """The row tile a Dot / Swap config launches with at M rows."""
    return cfg.block_m or min(64, max(16, 1 << (m - 1).bit_length()))


def _table_points():
    """Every boundary of the tables' ranges, one below and one above, over the shapes of
    the 7B/8B models and small ones, group sizes that are and are not multiples of 128, K
    that is not: each point is one problem the lookup must place in exactly one row."""
    ms, ns, ws = {1, 4096}, {8, 64}, set()
    for rows in cfg_mod.TABLES.values():
        for r in rows:
            ms.update(v + d for v in r.m for d in (-1, 0, 1) if 0 < v + d and v < cfg_mod.INF)
            ns.update(v + d for v in r.n for d in (-8, 0, 8) if 0 < v + d and v < cfg_mod.INF)
            ws.update(v for v in r.weights if v < cfg_mod.INF)
    shapes = {(k, n) for k in (4096, 4160, 11008, 576, 3584) for n in ns}
    shapes |= {(4096, w // 4096 + d) for w in ws for d in (-8, 0) if w // 4096 + d > 0}
    for k, n in sorted(shapes):
        for gs in (32, 40, 64, 128, 256, k):
            for packed in (False, True) if k % 128 == 0 and gs % 128 == 0 else (False,):
                for m in sorted(ms):
                    yield m, n, k, gs, packed


def test_table_covers_every_problem_once():
    """No gaps, no overlaps: exactly one row of each family's table matches every problem
    (fp16 / bf16 / fp32 x, any M, N, K, group size, plane-packed words or not)."""
    count = 0
    for m, n, k, gs, packed in _table_points():
        for family, rows in cfg_mod.TABLES.items():
            for act in ("fp16", "bf16", "fp32"):
                hits = [r for r in rows if r.matches(act, m, n, k, gs, packed)]
                assert len(hits) == 1, (family, act, m, n, k, gs, packed, hits)
                count += 1
    assert count > 10_000
    with pytest.raises(LookupError, match="0 rows"):
        cfg_mod.lookup("wgmma", "fp16", 0, 4096, 4096, 128)
    assert cfg_mod.lookup("wgmma", "fp16", 1, 4096, 4096, 20) == cfg_mod.Dequant()


def test_table_buckets():
    for half, fp16 in ((True, True), (True, False), (False, False)):  # fp16, bf16, fp32 x
        for m in (1, 2, 3, 4, 5, 16, 33, 64, 65, 1024):
            cfg = _pick(m, 4096, 4096, 128, half=half, fp16=fp16)
            want = (cfg_mod.Gemv16 if half and m <= 2 else cfg_mod.Swap if fp16 and m <= 64
                    else cfg_mod.Gemv16 if half and m <= 4 else cfg_mod.Gemv if m == 1 else
                    cfg_mod.Dot if m <= 64 else cfg_mod.Dequant)
            assert type(cfg) is want, (m, half, fp16, cfg)
            if want is cfg_mod.Swap:  # the MMA's N side (activation rows) covers M up to 64
                assert _block_m(cfg, m) == min(64, max(16, 1 << (m - 1).bit_length()))
                assert cfg.block_k >= 128
            if want is cfg_mod.Dot:
                assert _block_m(cfg, m) >= min(m, 16) and (not cfg.nibble_dots
                                                          or cfg.block_k >= 128)
                # bf16 / fp32 x: the fp32 unpacking in k order
                assert not cfg.fp16_planes
            if want is cfg_mod.Gemv16:
                assert cfg.rows is None  # one program row chunk holds every activation row


def test_swap_dispatch_follows_the_mma_kind():
    """Where dots compile for mma.sync (sm_8x), 3-16 fp16 rows take the plane dots with x's
    tile split in registers, or over x copied into plane order for >= 32M weights at 3-8
    rows and gate/up widths at 9-16, and 17-64 the plane dots over x in plane order (those
    need K and the group size multiples of 128; otherwise the "dot" kernel with joined fp16
    planes); with wgmma (Hopper) the joined swap tile serves 3-64, except at 3-16 rows and
    N >= 16,384 (the gate/up widths) with K a multiple of 128, where the plane dots run over
    a copy of x in plane order (where each was measured fastest)."""
    for m in (3, 8, 16):
        for gs in (32, 128):
            cfg = _pick(m, 4096, 4096, gs, mma_sync=True)
            assert (type(cfg), cfg.x_split, cfg.x_planes, cfg.block_m, cfg.block_k) == (
                cfg_mod.Swap, True, False, 16, 128)
    for m, n, k, gs, planes in ((3, 12288, 4096, 128, True), (8, 4096, 11008, 128, True),
                                (8, 4096, 4096, 128, False), (16, 12288, 4096, 128, False),
                                (16, 22016, 4096, 128, True), (4, 22016, 4160, 128, False),
                                (4, 22016, 4096, 64, False)):
        cfg = _pick(m, n, k, gs, mma_sync=True)
        assert (type(cfg), cfg.x_planes, cfg.x_split, cfg.block_m) == (
            cfg_mod.Swap, planes, not planes, 16), (m, n, k, gs)
    for m, bm in ((17, 32), (32, 32), (33, 64), (64, 64)):
        cfg = _pick(m, 4096, 4096, 128, mma_sync=True)
        assert (type(cfg), cfg.x_planes, cfg.x_split, _block_m(cfg, m), cfg.block_k) == (
            cfg_mod.Swap, True, False, bm, 128)
        for n, k, gs in ((4096, 4160, 128), (4096, 4096, 64)):
            cfg = _pick(m, n, k, gs, mma_sync=True)
            assert (type(cfg), cfg.fp16_planes, cfg.nibble_dots) == (cfg_mod.Dot, True, False)
    assert type(_pick(65, 4096, 4096, 128, mma_sync=True)) is cfg_mod.Dequant
    assert type(_pick(32, 4096, 4096, 128, fp16=False, mma_sync=True)) is cfg_mod.Dot
    assert type(_pick(2, 4096, 4096, 128, mma_sync=True)) is cfg_mod.Gemv16
    assert type(_pick(8, 4096, 4096, 128, fp16=False, mma_sync=True)) is cfg_mod.Dot
    for m in (3, 16):
        wide = _pick(m, 22016, 4096, 128)
        assert (type(wide), wide.x_planes, wide.x_split) == (cfg_mod.Swap, True, False)
        for n, k, gs in ((12288, 4096, 128), (22016, 4160, 128), (22016, 4096, 64)):
            cfg = _pick(m, n, k, gs)
            assert type(cfg) is cfg_mod.Swap and not (cfg.x_split or cfg.x_planes)
    assert not _pick(17, 22016, 4096, 128).x_planes
    for m, n in ((1, 4096), (1, 12288), (2, 37888)):  # the 1-2 row tile sums split K itself
        cfg = _pick(m, n, 4096, 128)
        assert (type(cfg), cfg.block_n, cfg.fused_reduce) == (cfg_mod.Gemv16, 64, True)
    assert type(_pick(4, 22016, 4096, 128, fp16=False)) is cfg_mod.Gemv16


def test_plane_packed_dispatch():
    """Plane-packed words: the plane dots reading x as it is at 3-32 rows on
    both MMA kinds and at 33-64 on mma.sync; on wgmma at 33-64 the joined tile with its
    columns in plane order, and at 65-128 the same over 128-row tiles for >= 16M weights;
    else above 64 rows dequantize + cuBLAS."""
    for mma_sync in (False, True):
        for m, bm in ((3, 16), (16, 16), (17, 32), (32, 32)):
            cfg = _pick(m, 4096, 4096, 128, mma_sync=mma_sync, planes_packed=True)
            assert (type(cfg), cfg.x_planes, _block_m(cfg, m)) == (
                cfg_mod.Swap, True, bm), (m, mma_sync, cfg)
        for m in (33, 48, 64):
            cfg = _pick(m, 4096, 4096, 128, mma_sync=mma_sync, planes_packed=True)
            assert (type(cfg), _block_m(cfg, m), cfg.block_k) == (cfg_mod.Swap, 64, 128)
            assert (cfg.x_planes, cfg.plane_major) == (
                (True, False) if mma_sync else (False, True)), (m, mma_sync, cfg)
            std = _pick(m, 4096, 4096, 128, mma_sync=mma_sync)
            assert not std.plane_major
        for m, n, k in ((65, 4096, 4096), (128, 12288, 4096), (129, 4096, 4096),
                        (96, 4608, 3584)):
            cfg = _pick(m, n, k, 128, mma_sync=mma_sync, planes_packed=True)
            # wgmma, 65-128 rows, >= 16M weights: the joined tile in plane order, 128 rows
            if not mma_sync and m <= 128 and n * k >= 1 << 24:
                assert (type(cfg), cfg.block_m, cfg.plane_major) == (cfg_mod.Swap, 128, True)
            else:
                assert type(cfg) is cfg_mod.Dequant, (m, n, k)
        assert type(_pick(96, 4096, 4096, 128)) is cfg_mod.Dequant


def test_plane_dot_options_are_checked():
    x = torch.randn(4, 320).half()
    qw = torch.zeros(40, 16, dtype=torch.int32)
    s = torch.ones(3, 16).half()
    with pytest.raises(ValueError, match="x_planes needs K"):  # K = 320: 2.5 K tiles
        w4.w4a16_matmul(x, qw, s, s, 128, config=cfg_mod.Swap(
            block_m=16, block_n=16, x_planes=True))
    for kw in (dict(x_split=True, x_planes=True), dict(x_split=True, plane_major=True)):
        with pytest.raises(ValueError, match="exclude each other"):
            cfg_mod.Swap(**kw)
    with pytest.raises(ValueError, match="plane_major"):  # standard words
        w4.w4a16_matmul(x, qw, s, s, 128, config=cfg_mod.Swap(plane_major=True))
    with pytest.raises(ValueError, match="fp16 activations"):  # every swap row is fp16
        w4.w4a16_matmul(x.bfloat16(), qw, s.bfloat16(), s.bfloat16(), 128,
                        config=cfg_mod.Swap())
    with pytest.raises(ValueError, match="no nibble_dots"):  # the fp16 planes join
        cfg_mod.Dot(nibble_dots=True, fp16_planes=True)
    with pytest.raises(ValueError, match="one activation row"):  # the fp32 GEMV
        w4.w4a16_matmul(x.float(), qw, s.float(), s.float(), 128, config=cfg_mod.Gemv())


def test_dots_from_registers(monkeypatch):
    from edge_llm.kernels.device import dots_from_registers

    monkeypatch.delenv("DISABLE_MMA_V3", raising=False)
    assert dots_from_registers(torch.device("cpu"))  # the interpreter; sm_89 compiles
    # CUDA devices by compute capability (the properties stubbed): mma.sync on sm_8x and
    # consumer Blackwell (sm_12x), wgmma / tcgen05 on Hopper and datacenter Blackwell
    from edge_llm.kernels import device as dev_mod

    cuda = torch.device("cuda", 0)
    for major, want in ((8, True), (9, False), (10, False), (12, True)):
        monkeypatch.setattr(dev_mod, "_props", lambda d, major=major: SimpleNamespace(
            major=major, minor=0))
        assert dev_mod.dots_from_registers(cuda) == want, major
        monkeypatch.setenv("DISABLE_MMA_V3", "1")
        assert dev_mod.dots_from_registers(cuda)
        monkeypatch.delenv("DISABLE_MMA_V3")


def test_one_row_gemv_dispatch():
    """fp16 at 1-2 rows with groups of a multiple of 128: one-group K tiles with flat scale
    rows and loads staged 4 tiles ahead, the zero points folded (where the caller vouches
    for integers: kernels/w4a16_gemv.py); bf16, or groups of 32/64, keep the 32-column tile."""
    for m in (1, 2):
        for gs in (128, 256, 4096):
            cfg = _pick(m, 12288, 4096, gs)
            assert (type(cfg), cfg.block_n, cfg.block_k, cfg.rows, cfg.pipe_stages,
                    cfg.flat_scales, cfg.fold_zero) == (
                cfg_mod.Gemv16, 64, 128, None, 4, True, True), (m, gs, cfg)
        for gs, fp16 in ((64, True), (32, True), (128, False)):
            cfg = _pick(m, 12288, 4096, gs, fp16=fp16)
            assert (type(cfg), cfg.block_n, cfg.pipe_stages, cfg.fold_zero) == (
                cfg_mod.Gemv16, 32, 0, False), (m, gs, fp16, cfg)


def test_gemv_split_matches_the_measured_best():
    """At 1-2 rows the split comes from ~2.5 programs per multiprocessor: on a 132-SM H200
    that is the measured best split of every 7B shape for the 32-column tile, which bf16
    activations and groups not a multiple of 128 keep."""
    from edge_llm.kernels import splitk
    from edge_llm.kernels.grid import cdiv

    best = {(4096, 12288): 1, (4096, 4096): 4, (4096, 22016): 1, (11008, 4096): 4,
            (3584, 4608): 4, (3584, 3584): 4, (3584, 37888): 1, (18944, 3584): 4}
    for (k, n), split in best.items():
        for m, fp16, gs in ((1, False, 128), (2, False, 128), (1, True, 64)):
            cfg = _pick(m, n, k, gs, fp16=fp16)
            assert (cfg.block_n, cfg.block_k, cfg.pipe_stages) == (32, 512, 0)
            got = splitk.plan(cdiv(n, cfg.block_n), k, cfg.block_k, cfg.split_k, cfg.waves,
                              cfg.min_k_tiles, 132)[0]
            assert got == split, (k, n, m, got)


def _naive_attention(q, kc, vc, table, qsl, sl, scale):
    """Loop over sequences, heads and queries: the definition in the module docstring."""
    t, h, d = q.shape
    bs, hkv = kc.shape[1], kc.shape[2]
    out = torch.zeros(t, h, d, dtype=torch.float64)
    for b in range(len(sl)):
        n_ctx, qs, qe = int(sl[b]), int(qsl[b]), int(qsl[b + 1])
        slots = [int(table[b, p // bs]) * bs + p % bs for p in range(n_ctx)]
        k = kc.reshape(-1, hkv, d)[slots].double()  # (L, Hkv, D)
        v = vc.reshape(-1, hkv, d)[slots].double()
        for i in range(qe - qs):
            pos = n_ctx - (qe - qs) + i
            for hh in range(h):
                kvh = hh // (h // hkv)
                scores = k[: pos + 1, kvh] @ q[qs + i, hh].double() * scale
                out[qs + i, hh] = torch.softmax(scores, 0) @ v[: pos + 1, kvh]
    return out


@pytest.mark.parametrize("nq,ctx,h,hkv,bs", [
    ([1, 1, 1], [5, 17, 9], 4, 2, 4),  # decode path of the reference
    ([3, 1, 6], [7, 4, 6], 6, 3, 4),  # general path: chunk with prefix, decode, prefill
    ([2, 0, 1], [9, 3, 1], 8, 1, 8),  # a sequence with no new query
])
def test_paged_attention_ref_matches_naive(nq, ctx, h, hkv, bs):
    d = 8
    nblk = sum(-(-c // bs) for c in ctx)
    perm = torch.randperm(nblk + 3).to(torch.int32)
    table = torch.full((len(ctx), max(-(-c // bs) for c in ctx) + 1), int(perm[-1]),
                       dtype=torch.int32)
    start = 0
    for i, c in enumerate(ctx):
        used = -(-c // bs)
        table[i, :used] = perm[start:start + used]
        start += used
    kc = torch.randn(nblk + 3, bs, hkv, d)
    vc = torch.randn(nblk + 3, bs, hkv, d)
    qsl = torch.tensor([0] + nq).cumsum(0).to(torch.int32)
    q = torch.randn(int(qsl[-1]), h, d)
    sl = torch.tensor(ctx, dtype=torch.int32)
    ref = kernels.paged_attention(q, kc, vc, table, qsl, sl, 0.4)  # CPU dispatch: reference
    assert torch.allclose(ref.double(), _naive_attention(q, kc, vc, table, qsl, sl, 0.4),
                          atol=1e-5)


def test_cpu_dispatch_uses_references():
    qw = w4.pack_w4_ref(torch.randint(0, 16, (64, 16)))
    s, z, x = torch.rand(2, 16) * 0.1, torch.rand(2, 16) * 8, torch.randn(2, 3, 64)
    assert torch.equal(kernels.w4a16_matmul(x, qw, s, z, 32), w4.w4a16_matmul_ref(x, qw, s, z, 32))
    kc, vc = torch.randn(4, 8, 2, 16), torch.randn(4, 8, 2, 16)
    kc2, vc2 = kc.clone(), vc.clone()
    k, v, slots = torch.randn(3, 2, 16), torch.randn(3, 2, 16), torch.tensor([5, -1, 30])
    kernels.write_kv(k, v, kc, vc, slots)
    pa.write_kv_ref(k, v, kc2, vc2, slots)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    assert torch.equal(kc.view(-1, 2, 16)[30], k[2]) and torch.equal(vc.view(-1, 2, 16)[5], v[0])
    # a merged [gate | up] projection: silu(gate) * up of the reference matmul, (..., N / 2)
    y = w4.w4a16_matmul_ref(x, qw, s, z, 32)
    want = torch.nn.functional.silu(y[..., :8]) * y[..., 8:]
    assert torch.equal(kernels.w4a16_silu_mul(x, qw, s, z, 32), want)


def test_decode_split_plan():
    for programs, ctx, sms, block_n in [(256, 2048, 132, 64), (4, 8192, 132, 64), (8, 100, 82, 32),
                                        (1, 1, 8, 16), (1000, 32768, 128, 128)]:
        splits, part = pa.decode_split_plan(programs, ctx, sms, block_n)
        assert part % block_n == 0 and splits >= 1
        assert splits * part >= ctx and (splits - 1) * part < ctx  # no empty split
        assert part >= min(256, math.ceil(ctx / block_n) * block_n) or splits == 1
    few, _ = pa.decode_split_plan(4, 8192, 132, 64)
    many, _ = pa.decode_split_plan(512, 8192, 132, 64)
    assert few > many == 1
    assert pa.decode_split_plan(4, 8192, 132, 64, num_splits=3)[0] == 3


def test_attention_input_errors():
    from edge_llm.kernels.paged_common import check_cache

    kc = torch.randn(4, 8, 2, 16)
    with pytest.raises(ValueError, match="q: expected"):
        check_cache(torch.randn(3, 3, 16), kc, kc)
    with pytest.raises(ValueError, match="k_cache/v_cache"):
        check_cache(torch.randn(3, 4, 16), kc, torch.randn(4, 8, 2, 8))
    with pytest.raises(ValueError, match="slot_mapping"):
        pa.write_kv(torch.randn(3, 2, 16), torch.randn(3, 2, 16), kc, kc.clone(),
                    torch.zeros(2, dtype=torch.int64))


def test_host_grid_helpers_match_triton():
    """kernels/grid.py's plain cdiv / next_pow2 (host code) agree with triton's."""
    import triton

    from edge_llm.kernels.grid import cdiv, next_pow2

    for a in range(0, 3000, 7):
        for b in (1, 3, 16, 64, 128, 1000):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
    for n in range(1, 70000, 13):
        assert next_pow2(n) == triton.next_power_of_2(n), n
    assert next_pow2(1) == 1 and next_pow2(2) == 2 and next_pow2(1 << 20) == 1 << 20
