"""The W4A16 Triton kernels vs their torch reference on the CPU, under TRITON_INTERPRET=1:
every launch kind, plane-packed words, split K (the other kernels:
tests/test_kernels_interpret.py).

The interpreter must be switched on before Triton is imported, so every ``case_*`` below runs
in one child process (this file executed as a script) and reports back as JSON; the tests here
only read that report. Inputs are fresh random draws (seed printed on failure), never zeros.
"""

from __future__ import annotations

import sys

import pytest

try:
    import tests.interpret_child as ic
except ImportError:  # run as the interpreted child script: tests/ is sys.path[0]
    import interpret_child as ic


# ----------------------------------------------------------------------------- helpers (child)


def _w4_problem(m, k, n, gs, dtype, lead=(), integer_zeros=False):
    import torch

    from edge_llm.kernels.w4a16 import pack_w4_ref

    g = -(-k // gs)
    qw = pack_w4_ref(torch.randint(0, 16, (k, n)))
    s = (torch.rand(g, n) * 0.05 + 0.005).to(dtype)
    if integer_zeros:  # as every checkpoint format has
        z = torch.randint(0, 17, (g, n)).to(dtype)
    else:
        z = (torch.rand(g, n) * 15).to(dtype)  # non-integer zero points
    x = torch.randn(*lead, m, k).to(dtype)
    return x, qw, s, z


def _check_w4(m, k, n, gs, dtype, cfg=None, lead=(), integer_zeros=False, planes=False):
    """The kernel against the reference; ``planes``: the kernel gets the same weights in
    the plane-packed word order (pack_planes_ref), the reference the standard words."""
    from edge_llm.kernels.w4a16 import pack_planes_ref, w4a16_matmul, w4a16_matmul_ref

    x, qw, s, z = _w4_problem(m, k, n, gs, dtype, lead, integer_zeros)
    words = pack_planes_ref(qw) if planes else qw
    y = w4a16_matmul(x, words, s, z, gs, config=cfg, integer_zeros=integer_zeros,
                     planes_packed=planes)
    assert y.shape == (*lead, m, n) and y.dtype == dtype
    err = ic.rel_err(y, w4a16_matmul_ref(x, qw, s, z, gs))
    assert err < ic.tolerance(dtype), (
        f"M={m} K={k} N={n} gs={gs} {dtype} {cfg} planes={planes}: rel err {err:.2e}")


# ------------------------------------------------------------------------------ cases (child)


def case_w4a16_gemv():
    import torch

    from edge_llm.kernels import w4a16_config as wc

    _check_w4(1, 256, 96, 32, torch.float32)  # auto config, per-row scale groups
    _check_w4(1, 512, 64, 128, torch.float16, wc.Gemv(block_n=32, block_k=128, split_k=3))
    _check_w4(1, 256, 64, 256, torch.float32)  # per channel (group_size == K)
    _check_w4(1, 320, 48, 64, torch.float32, wc.Gemv(block_n=64, block_k=256, split_k=1))


def case_w4a16_gemv16():
    """The fp16x2-pair path (its plain-Triton twin under the interpreter): pairing, zero
    points, per-tile and per-row scales, row chunks with missing rows, splits, bf16."""
    import torch

    from edge_llm.kernels import w4a16_config as wc

    for m in (1, 2, 3, 4):
        _check_w4(m, 512, 64, 128, torch.float16)  # dispatched
    _check_w4(7, 1024, 96, 256, torch.float16, wc.Gemv16(block_n=32, block_k=128, split_k=3,
                                                         rows=3))
    _check_w4(2, 1024, 96, 128, torch.bfloat16, wc.Gemv16(block_n=64, block_k=128, split_k=2,
                                                          rows=2))
    _check_w4(6, 320, 48, 64, torch.float16, wc.Gemv16(block_n=64, block_k=256, split_k=1, rows=4))
    _check_w4(5, 1024, 96, 1024, torch.float16, wc.Gemv16(block_n=64, block_k=256, rows=4, waves=8,
                                                          min_k_tiles=1))
    # several groups per K tile (per-word-row scales): 4 groups of 64 with a ragged last
    # tile (K = 17 groups, split 2), and 16 groups of 32 in one 512 tile
    _check_w4(2, 1088, 80, 64, torch.float16, wc.Gemv16(block_n=32, block_k=256, split_k=2, rows=2))
    _check_w4(1, 512, 64, 32, torch.float16, wc.Gemv16(block_n=32, block_k=512, split_k=1, rows=1))
    # K tiles inside one group, integer zero points, the zero point folded into the bias
    # constants or not, flat scale rows or not: one row; three rows with a split; bf16; with
    # flat rows on whole tiles nothing is masked (the last tile of each split prefetches
    # itself again, a missing activation row reads the last one)
    for m, k, gs, split, dtype, bn, fold, flat in (
            (1, 512, 128, 1, torch.float16, 64, True, False),
            (3, 1024, 256, 3, torch.float16, 64, True, True),
            (2, 512, 64, 2, torch.bfloat16, 64, True, True),
            (2, 1024, 128, 3, torch.float16, 32, True, True),
            (7, 1024, 128, 3, torch.float16, 32, False, True)):
        cfg = wc.Gemv16(block_n=bn, block_k=min(gs, 128), split_k=split, rows=min(m, 3),
                        fold_zero=fold, flat_scales=flat)
        _check_w4(m, k, 96, gs, dtype, cfg, integer_zeros=True)
    # the tile loads staged through shared memory (tl.range's pipeliner; the interpreter runs
    # the same loop unstaged): dispatched tile, ragged split, per-row scales, flat + folded
    for m, k, gs, cfg in (
            (1, 1024, 128, wc.Gemv16(block_n=32, block_k=512, rows=1, pipe_stages=3, waves=2.5,
                                     min_k_tiles=1)),
            (3, 1088, 64, wc.Gemv16(block_n=32, block_k=256, split_k=2, rows=3,
                                    pipe_stages=4)),
            (2, 1024, 128, wc.Gemv16(block_n=64, block_k=128, split_k=3, rows=2, fold_zero=True,
                                     flat_scales=True, pipe_stages=2))):
        _check_w4(m, k, 96, gs, torch.float16, cfg, integer_zeros=True)
    # the dispatched one-row tile (groups of 128: one-group K tiles, flat scales, staged
    # loads), zero points folded only when vouched for as integers; whole and ragged K
    for m in (1, 2):
        for k in (1024, 1088):
            for integer_zeros in (False, True):
                _check_w4(m, k, 96, 128, torch.float16, integer_zeros=integer_zeros)


def case_w4a16_small_m():
    import torch

    from edge_llm.kernels import w4a16_config as wc

    _check_w4(3, 256, 64, 64, torch.float32)  # nibble-plane dots
    _check_w4(16, 512, 80, 128, torch.float16)  # k-order dot, N not a tile multiple
    _check_w4(16, 256, 64, 256, torch.float32,
              wc.Dot(block_m=16, block_n=32, block_k=128, split_k=2, nibble_dots=True))
    _check_w4(5, 384, 64, 128, torch.float32, wc.Dot(block_m=16, block_n=32, block_k=128,
                                                     split_k=3))
    # fp16 planes (their plain-Triton twin here) joined into one dot in k order: a split,
    # a 32-wide tile, groups of 32 (the K tile clamped to the group)
    _check_w4(16, 512, 64, 128, torch.float16,
              wc.Dot(block_m=16, block_n=64, block_k=128, split_k=2, fp16_planes=True))
    _check_w4(9, 512, 96, 64, torch.float16,
              wc.Dot(block_m=16, block_n=32, block_k=64, split_k=1, fp16_planes=True))
    _check_w4(33, 256, 64, 32, torch.float16, wc.Dot(block_m=64, block_n=64, block_k=64, split_k=1,
                                                     fp16_planes=True))
    _check_w4(4, 256, 64, 40, torch.float32)  # group size not a power of two
    _check_w4(2, 256, 32, 128, torch.float16, lead=(3,))  # leading batch dims


def case_w4a16_swap():
    """The weights as the left operand (kernels/w4a16_swap.py, fp16 x): the joined tile and
    the plane dots (x split in registers, x copied into plane order), per-tile and per-row
    scales, ragged M and N, split K summed in the kernel and by a second launch."""
    import torch

    from edge_llm.kernels import w4a16_config as wc

    _check_w4(16, 512, 64, 128, torch.float16, wc.Swap(block_m=16, block_n=64, block_k=128,
                                                       split_k=1))
    _check_w4(9, 1024, 96, 128, torch.float16, wc.Swap(block_m=16, block_n=32, block_k=256,
                                                       split_k=3))
    _check_w4(40, 256, 64, 32, torch.float16, wc.Swap(block_m=32, block_n=64, block_k=128,
                                                      split_k=2, fused_reduce=False))
    # plane dots with x's tile split into planes in registers (the mma.sync dispatch at
    # 3-16 rows; 32 here too): per-tile and per-row scales, K not a whole number of tiles,
    # a split
    _check_w4(16, 512, 64, 128, torch.float16, wc.Swap(block_m=16, block_n=64, block_k=128,
                                                       split_k=1, x_split=True))
    _check_w4(21, 520, 80, 32, torch.float16, wc.Swap(block_m=32, block_n=32, block_k=128,
                                                      split_k=2,
                                                      fused_reduce=False, x_split=True))
    # plane dots over x copied into plane order (Hopper, wide N): a split, leading dims
    _check_w4(5, 512, 64, 128, torch.float16, wc.Swap(block_m=16, block_n=64, block_k=128,
                                                      split_k=2, x_planes=True),
              lead=(2,))
    _check_w4(3, 256, 48, 256, torch.float16, wc.Swap(block_m=16, block_n=16, block_k=256,
                                                      split_k=1, x_planes=True))
    # ... and as dispatched at 33-64 rows on mma.sync: 64-row tiles, the split summed by a
    # second launch, ragged M
    _check_w4(40, 512, 64, 128, torch.float16, wc.Swap(block_m=64, block_n=64, block_k=128,
                                                       split_k=2,
                                                       fused_reduce=False, x_planes=True))


def case_w4a16_planes_packed():
    """Plane-packed words (pack_planes_ref) through every kind of kernel: the one-row GEMV
    reading x in the new order (folded zero points, a split summed in the kernel, a second
    K tile in one group), the plane dots reading x as it is (3-16 and 17-64 row tiles, with
    leading dims), the dequantize pass, and the k-order kernels fed x permuted to match
    (joined swap tile, "dot", the fp32 GEMV, x split in registers)."""
    import torch

    from edge_llm.kernels import w4a16_config as wc

    g16 = dict(block_n=64, block_k=128, split_k=2, num_warps=4,
               flat_scales=True, min_k_tiles=1, pipe_stages=2)
    _check_w4(1, 512, 64, 128, torch.float16, wc.Gemv16(rows=1, fold_zero=True, **g16),
              integer_zeros=True, planes=True)
    for split in (1, 2):  # splits of 8 and 4 tiles: the register ring with no slot past its end
        _check_w4(1, 1024, 64, 128, torch.float16,
                  wc.Gemv16(rows=1, fold_zero=True, **{**g16, "split_k": split}),
                  integer_zeros=True, planes=True)
    _check_w4(2, 512, 96, 256, torch.float16, wc.Gemv16(rows=2, **g16), planes=True)
    _check_w4(1, 384, 64, 384, torch.float16, wc.Gemv16(block_n=32, block_k=128, split_k=3,
                                                        rows=1), planes=True)
    _check_w4(1, 256, 64, 128, torch.bfloat16, wc.Gemv16(block_n=32, block_k=128, split_k=1,
                                                         rows=1), planes=True)  # bf16 x: a copy
    _check_w4(2, 512, 64, 128, torch.float16, wc.Gemv16(block_n=64, block_k=256, rows=2,
                                                        min_k_tiles=1),
              planes=True)  # K tiles of two plane tiles
    for m, mma_sync in ((3, False), (16, False), (24, True), (40, True), (40, False)):
        cfg = wc.lookup("mma_sync" if mma_sync else "wgmma", "fp16", m, 64, 512, 128,
                        packed=True)
        # the plane dots, or (wgmma, 33-64 rows) the joined tile in plane order
        assert (cfg.x_planes or cfg.plane_major) and cfg.block_k == 128, cfg
        _check_w4(m, 512, 64, 128, torch.float16, cfg, planes=True,
                  lead=(2,) if m == 3 else ())
    _check_w4(70, 256, 48, 128, torch.float32, planes=True)  # dequantize + matmul
    _check_w4(20, 512, 64, 128, torch.float16, wc.Swap(block_m=32, block_n=64, block_k=128,
                                                       split_k=1),
              planes=True)  # joined tile in k order, fed a copy of x (not dispatched)
    for split in (1, 2):  # ... with its columns in plane order: x as it is
        _check_w4(40, 512, 80, 128, torch.float16, wc.Swap(block_m=64, block_n=64, block_k=128,
                                                           split_k=split, plane_major=True),
                  planes=True)
    _check_w4(70, 256, 64, 128, torch.float16, wc.Swap(block_m=128, block_n=64, block_k=128,
                                                       waves=1, min_k_tiles=1, fused_reduce=False,
                                                       plane_major=True),
              planes=True)  # the Hopper choice at 65-128 rows: 128-row tiles, a row masked
    _check_w4(5, 256, 64, 128, torch.float16, wc.Dot(block_m=16, block_n=64, block_k=128,
                                                     split_k=1, fp16_planes=True),
              planes=True)
    _check_w4(1, 256, 64, 128, torch.float32, wc.Gemv(block_n=64, block_k=128, split_k=1),
              planes=True)
    _check_w4(6, 512, 64, 128, torch.float16, wc.Swap(block_m=16, block_n=64, block_k=128,
                                                      split_k=1, x_split=True),
              planes=True)
    _check_w4(5, 512, 64, 256, torch.float16, wc.Swap(block_m=16, block_n=64, block_k=256,
                                                      split_k=1, x_planes=True),
              planes=True)


def case_w4a16_large_m_and_fallbacks():
    import torch

    from edge_llm.kernels import w4a16_config as wc

    _check_w4(33, 256, 64, 32, torch.float32)  # tile clamped to the group
    _check_w4(40, 256, 96, 128, torch.float32, wc.Dot(block_m=64, block_n=32, block_k=64,
                                                      split_k=1))
    _check_w4(70, 256, 48, 64, torch.float32)  # dequantize + matmul
    _check_w4(3, 256, 64, 20, torch.float32)  # words straddle groups: dequant path


def case_w4a16_splitk_in_kernel():
    """Split K summed by the last program of each tile equals the separate reduce launch
    bit for bit (both add partials in split order), and leaves every counter at zero (so a
    second launch, or a CUDA graph replay, starts clean)."""
    import dataclasses

    import torch

    from edge_llm.kernels import splitk
    from edge_llm.kernels import w4a16_config as wc
    from edge_llm.kernels.w4a16 import w4a16_matmul, w4a16_matmul_ref

    for m, k, n, gs, dtype, cfg in (
        (1, 1024, 96, 128, torch.float16, wc.Gemv16(block_n=32, block_k=128, split_k=4, rows=1)),
        (7, 1024, 96, 256, torch.float16, wc.Gemv16(block_n=32, block_k=128, split_k=3, rows=3)),
        (6, 512, 80, 64, torch.float32, wc.Dot(block_m=16, block_n=32, block_k=64, split_k=5)),
        (20, 512, 64, 128, torch.float32, wc.Dot(block_m=16, block_n=32, block_k=128, split_k=2,
                                                 nibble_dots=True)),
    ):
        x, qw, s, z = _w4_problem(m, k, n, gs, dtype)
        fused = w4a16_matmul(x, qw, s, z, gs, config=cfg)
        again = w4a16_matmul(x, qw, s, z, gs, config=cfg)
        split = w4a16_matmul(x, qw, s, z, gs, config=dataclasses.replace(cfg,
                                                                         fused_reduce=False))
        assert torch.equal(fused, split) and torch.equal(fused, again), f"{cfg}"
        assert ic.rel_err(fused, w4a16_matmul_ref(x, qw, s, z, gs)) < ic.tolerance(dtype), f"{cfg}"
        counters = splitk.counters(x.device, 1)
        assert counters is not None and int(counters.abs().sum()) == 0, f"{cfg}"


def case_w4a16_silu_epilogue():
    """silu(gate) * up in the one-row GEMV's epilogue (``silu_mul=True``, SILU in the
    kernel) against the two-kernel path of the same launch (its [M, 2 I] output, then
    ``fused.silu_and_mul``): 1 and 2 rows, a third row in a second program, fp16 and bf16,
    plane-packed words, per-word-row scales; and launches without that epilogue (a split K,
    the plane dots, a column count that is no multiple of the tile) give the two-kernel
    result through the fallback."""
    import torch

    from edge_llm.kernels import fused
    from edge_llm.kernels import w4a16 as w4
    from edge_llm.kernels import w4a16_config as wc

    g16 = dict(block_n=64, block_k=128, split_k=1, num_warps=4,
               flat_scales=True, min_k_tiles=1, pipe_stages=2)
    cases = [  # m, k, 2 I, group, dtype, config, plane-packed, fused in the epilogue
        (1, 512, 256, 128, torch.float16, wc.Gemv16(rows=1, fold_zero=True, **g16), False,
         True),
        (2, 512, 192, 128, torch.float16, wc.Gemv16(rows=2, **g16), True, True),
        (3, 256, 128, 128, torch.bfloat16, wc.Gemv16(rows=2, **g16), False, True),
        (1, 512, 128, 64, torch.float16, wc.Gemv16(block_n=32, block_k=256, split_k=1, rows=1),
         False, True),
        (1, 512, 256, 128, torch.float16, wc.Gemv16(rows=1, **{**g16, "split_k": 2}),
         False, False),
        (1, 512, 160, 128, torch.float16, wc.Gemv16(rows=1, **g16), False, False),
        (4, 512, 256, 128, torch.float16, wc.lookup("wgmma", "fp16", 4, 256, 512, 128),
         False, False),
    ]
    for m, k, n, gs, dtype, cfg, planes, want_fused in cases:
        x, qw, s, z = _w4_problem(m, k, n, gs, dtype, integer_zeros=True)
        words = w4.pack_planes_ref(qw) if planes else qw
        kw = dict(config=cfg, integer_zeros=True, planes_packed=planes)
        y = w4.w4a16_matmul(x, words, s, z, gs, silu_mul=True, **kw)
        two = fused.silu_and_mul(w4.w4a16_matmul(x, words, s, z, gs, **kw))
        label = f"M={m} K={k} N={n} gs={gs} {dtype} {cfg} planes={planes}"
        if isinstance(cfg, wc.Gemv16):  # the launcher's own answer: N / 2 columns if fused
            y1 = w4.launch_gemv16(cfg, x.reshape(-1, k), words, s, z, gs, True, planes,
                                  silu=True)
            assert (y1.shape[-1] == n // 2) is want_fused, label
        assert y.shape == (m, n // 2) and y.dtype == dtype, label
        assert torch.equal(y, two), f"{label}: max diff {(y - two).abs().max()}"
        g, u = w4.w4a16_matmul_ref(x, qw, s, z, gs).to(dtype).float().chunk(2, dim=-1)
        act = (g / (1 + torch.exp(-g))).to(dtype).float()  # the kernels' roundings
        # bf16: the GEMV's own 0.4% (x converted to fp16) grows where silu is steep
        tol = ic.tolerance(dtype) * (3 if dtype == torch.bfloat16 else 1)
        assert ic.rel_err(y, (act * u).to(dtype)) < tol, label


def case_w4a16_one_row_sweep_candidates():
    """Every launch choice ``kernels_bench.py sweep --planes`` times at 1-2 rows computes the
    product (benchmarks/lib/w4a16_variants.py): a candidate that is wrong is no candidate."""
    import pathlib

    import torch

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    from lib.w4a16_variants import sweep_variants_planes

    for m in (1, 2):
        for cfg in sweep_variants_planes(m).values():
            _check_w4(m, 512, 256, 128, torch.float16, cfg, integer_zeros=True, planes=True)


def case_w4a16_gemv16_register_ring():
    """The pipelined GEMV at one row cycles its split's K tiles through four register
    buffers, the first four loaded before the PDL wait (RING), where its grid fits
    (``RING_RESIDENT`` programs a multiprocessor): splits of one to seven tiles (most no
    multiple of four, so the last group is short), a K that is no multiple of the tile (the
    last split short, its last tile masked), masked columns, groups smaller than the tile;
    against the reference, and bit for bit against the staged loop that a grid too large
    for the ring takes (the same products added in the same order); two rows take the
    staged loop."""
    import torch

    from edge_llm.kernels import w4a16_config as wc
    from edge_llm.kernels import w4a16_gemv as gemv
    from edge_llm.kernels.w4a16 import pack_planes_ref, w4a16_matmul

    kernel, rings = gemv._w4a16_gemv16_kernel, []

    class Spy:  # records each launch's RING
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                rings.append((kwargs["RING"], args[0].shape[0]))
                return kernel[grid](*args, **kwargs)
            return launch

    gemv._w4a16_gemv16_kernel = Spy()
    resident = gemv.RING_RESIDENT
    try:
        for split in (1, 2, 3):
            pipe = wc.Gemv16(block_n=64, block_k=128, pipe_stages=3, split_k=split,
                             fold_zero=True, flat_scales=True, min_k_tiles=1)
            _check_w4(1, 384, 128, 128, torch.float16, pipe, integer_zeros=True)
            _check_w4(1, 384, 96, 128, torch.float16, pipe, integer_zeros=True, planes=True)
            _check_w4(1, 320, 80, 64, torch.float16, pipe)  # K 2.5 tiles, groups of 64
            _check_w4(2, 384, 96, 128, torch.float16, pipe, integer_zeros=True, planes=True)
            for k in (640, 896):  # 5 and 7 tiles
                x, qw, s, z = _w4_problem(1, k, 96, 128, torch.float16, integer_zeros=True)
                words = pack_planes_ref(qw)
                ys = []
                for fit in (resident, 0):  # 0: no grid fits, the staged loop
                    gemv.RING_RESIDENT = fit
                    ys.append(w4a16_matmul(x, words, s, z, 128, config=pipe,
                                           integer_zeros=True, planes_packed=True))
                gemv.RING_RESIDENT = resident
                assert torch.equal(ys[0], ys[1]), (k, split)
    finally:
        gemv._w4a16_gemv16_kernel, gemv.RING_RESIDENT = kernel, resident
    assert {ring for ring, m in rings if m == 1} == {True, False}
    assert not any(ring for ring, m in rings if m == 2)


CASES = ic.list_cases(globals())


# ------------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    return ic.run_interpreted(__file__, tmp_path_factory.mktemp("interp"))


@pytest.mark.parametrize("case", CASES)
def test_w4a16_matches_reference_in_interpreter(report, case):
    ic.check_case(report, case)


if __name__ == "__main__":  # the interpreted child (run_interpreted)
    ic.run_cases(sys.argv[1], globals(), CASES)
