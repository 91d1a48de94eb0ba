"""The one-row GEMV with the RMSNorm before it and the residual add after it in the same kernel
(kernels/w4a16_gemv.py NORM and RESIDUAL: ``launch_gemv16(norm=)``, ``launch_gemv16_add``)
against the separate ops' references on the CPU, under TRITON_INTERPRET=1 (the PTX is the
one-row GEMV's, checked on the GPU by tests/test_one_row_chain_gpu.py).

Checks: the normalised product against ``w4a16_matmul_ref(rms_norm_ref(x))`` for split K of
1-3 (the last split short), plane-packed words read in place and permuted, SiLU in the same
epilogue, large residual values (a Llama residual reaches thousands: the row must be scaled
before the fp16 products); the added residual against ``residual + matmul`` and its sums of
squares tile by tile; a chain of the two (the squares the add leaves are the norm's input);
the second-launch split-K sum's torch epilogue; one row only.
"""

from __future__ import annotations

import sys

import pytest

try:
    import tests.interpret_child as ic
except ImportError:  # run as the interpreted child script: tests/ is sys.path[0]
    import interpret_child as ic


# ----------------------------------------------------------------------------- helpers (child)


def _problem(k, n, gs=128, planes=False):
    import torch

    from edge_llm.kernels.w4a16 import pack_planes_ref, pack_w4_ref

    qw = pack_w4_ref(torch.randint(0, 16, (k, n)))
    s = (torch.rand(k // gs, n) * 0.05 + 0.005).half()
    z = torch.randint(0, 17, (k // gs, n)).half()
    return (pack_planes_ref(qw) if planes else qw), qw, s, z


def _residual_row(k):
    """A fp16 row with a few Llama-like outliers (thousands): x * w of them overflows the
    kernel's fp16 products unless the row is normalised first."""
    import torch

    x = torch.randn(1, k) * 4
    x[0, 0], x[0, k // 3], x[0, 2 * k // 3] = 2500.0, -1800.0, 900.0
    return x.half()


def _parts(x, p):
    """x's fp32 sum of squares in ``p`` parts (any split works)."""
    import torch

    return torch.stack([c.float().square().sum() for c in x.reshape(-1).chunk(p)])


def _pipe(split, **kw):
    from edge_llm.kernels import w4a16_config as wc

    return wc.Gemv16(block_n=64, block_k=128, pipe_stages=3, split_k=split, fold_zero=True,
                     flat_scales=True, min_k_tiles=1, rows=1, **kw)


# ------------------------------------------------------------------------------ cases (child)


def case_norm_on_read():
    import torch

    from edge_llm.kernels import w4a16_config as wc
    from edge_llm.kernels.fused import rms_norm_ref
    from edge_llm.kernels.w4a16 import w4a16_matmul_ref
    from edge_llm.kernels.w4a16_gemv import RowNorm, launch_gemv16

    k, n, eps = 384, 128, 1e-5
    x = _residual_row(k)
    w = (torch.rand(k) * 2).half()
    configs = [_pipe(s) for s in (1, 2, 3)] + [
        wc.Gemv16(block_n=32, block_k=128, split_k=2, rows=1),  # register double buffering
        wc.Gemv16(block_n=32, block_k=256, split_k=1, rows=1)]  # planes: x permuted (a copy)
    for cfg in configs:
        for planes in (True, False):
            words, qw, s, z = _problem(k, n, planes=planes)
            for p in (1, 6):
                y = launch_gemv16(cfg, x, words, s, z, 128, True, planes,
                                  norm=RowNorm(w, eps, _parts(x, p)))
                ref = w4a16_matmul_ref(rms_norm_ref(x, w, eps), qw, s, z, 128)
                err = ic.rel_err(y, ref)
                assert err < ic.FP16_TOL, (cfg, planes, p, err)
                # the kernel without NORM on the normalised row: the same within fp16 rounding
                plain = launch_gemv16(cfg, rms_norm_ref(x, w, eps), words, s, z, 128, True,
                                      planes)
                assert ic.rel_err(y, plain) < 2e-3, (cfg, planes, p)


def case_norm_with_silu():
    import torch

    from edge_llm.kernels.fused import rms_norm_ref, silu_and_mul_ref
    from edge_llm.kernels.w4a16 import w4a16_matmul_ref
    from edge_llm.kernels.w4a16_gemv import RowNorm, launch_gemv16

    k, n, eps = 256, 256, 1e-6
    x = _residual_row(k)
    w = (torch.rand(k) + 0.5).half()
    words, qw, s, z = _problem(k, n, planes=True)
    y = launch_gemv16(_pipe(1), x, words, s, z, 128, True, True, silu=True,
                      norm=RowNorm(w, eps, _parts(x, 4)))
    assert y.shape == (1, n // 2)  # the epilogue's product, not [gate | up]
    ref = silu_and_mul_ref(w4a16_matmul_ref(rms_norm_ref(x, w, eps), qw, s, z, 128))
    assert ic.rel_err(y, ref) < ic.FP16_TOL


def case_residual_add():
    import torch

    from edge_llm.kernels import w4a16_config as wc
    from edge_llm.kernels.w4a16 import w4a16_matmul_ref
    from edge_llm.kernels.w4a16_gemv import launch_gemv16, launch_gemv16_add

    k, n = 384, 160  # 64-column tiles: the last one masked
    x = torch.randn(1, k).half()
    residual = (torch.randn(1, n) * 30).half()
    configs = [_pipe(s) for s in (1, 2, 3)] + [
        wc.Gemv16(block_n=32, block_k=128, split_k=2, rows=1),
        wc.Gemv16(block_n=32, block_k=128, split_k=3, rows=1, fused_reduce=False)]  # torch
    for cfg in configs:
        words, qw, s, z = _problem(k, n, planes=True)
        out, squares = launch_gemv16_add(cfg, x, words, s, z, 128, residual, True, True)
        assert out.shape == (1, n) and out.dtype == torch.float16
        y = launch_gemv16(cfg, x, words, s, z, 128, True, True)
        assert torch.equal(out, residual + y), cfg  # the same rounding as add_rms_norm
        ref = residual + w4a16_matmul_ref(x, qw, s, z, 128)
        assert ic.rel_err(out, ref) < ic.FP16_TOL, cfg
        assert squares.dtype == torch.float32
        if cfg.fused_reduce:  # one part a column tile
            tiles = -(-n // cfg.block_n)
            assert squares.shape == (tiles,), (cfg, squares.shape)
            want = torch.stack([c.float().square().sum() for c in out[0].split(cfg.block_n)])
            torch.testing.assert_close(squares, want, rtol=1e-5, atol=0)
        assert abs(float(squares.sum()) / float(out.float().square().sum()) - 1) < 1e-5


def case_add_then_norm():
    """The chain of a decode layer: o_proj adds into the residual, gate_up normalises it by
    the squares o_proj left."""
    import torch

    from edge_llm.kernels.fused import add_rms_norm_ref
    from edge_llm.kernels.w4a16_gemv import RowNorm, launch_gemv16, launch_gemv16_add

    h, eps = 256, 1e-5
    x = torch.randn(1, h).half()
    residual = _residual_row(h)
    w = (torch.rand(h) * 2).half()
    o_words, _, o_s, o_z = _problem(h, h, planes=True)
    up_words, _, up_s, up_z = _problem(h, 2 * h, planes=True)
    new, squares = launch_gemv16_add(_pipe(2), x, o_words, o_s, o_z, 128, residual, True, True)
    y = launch_gemv16(_pipe(1), new, up_words, up_s, up_z, 128, True, True,
                      norm=RowNorm(w, eps, squares))
    o = launch_gemv16(_pipe(2), x, o_words, o_s, o_z, 128, True, True)
    normed, res_ref = add_rms_norm_ref(o, residual, w, eps)
    assert torch.equal(new, res_ref)
    ref = launch_gemv16(_pipe(1), normed, up_words, up_s, up_z, 128, True, True)
    assert ic.rel_err(y, ref) < 2e-3


def case_one_row_only():
    import torch

    from edge_llm.kernels.w4a16_gemv import RowNorm, launch_gemv16, launch_gemv16_add

    words, _, s, z = _problem(256, 64)
    norm = RowNorm(torch.ones(256).half(), 1e-5, torch.ones(1))
    for call in (lambda: launch_gemv16(_pipe(1), torch.randn(2, 256).half(), words, s, z, 128,
                                       True, norm=norm),
                 lambda: launch_gemv16(_pipe(1), torch.randn(1, 256), words, s, z, 128, True,
                                       norm=norm),
                 lambda: launch_gemv16_add(_pipe(1), torch.randn(2, 256).half(), words, s, z,
                                           128, torch.zeros(2, 64).half()),
                 lambda: launch_gemv16_add(_pipe(1), torch.randn(1, 256).half(), words, s, z,
                                           128, torch.zeros(1, 32).half())):
        with pytest.raises(ValueError):
            call()


CASES = ic.list_cases(globals())


# ------------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    return ic.run_interpreted(__file__, tmp_path_factory.mktemp("interp"))


@pytest.mark.parametrize("case", CASES)
def test_gemv_norm_matches_reference_in_interpreter(report, case):
    ic.check_case(report, case)


if __name__ == "__main__":  # the interpreted child (run_interpreted)
    ic.run_cases(sys.argv[1], globals(), CASES)
