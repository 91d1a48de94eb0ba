"""The fused kernels (kernels/fused.py) vs their torch references under TRITON_INTERPRET=1.

Same pattern as tests/test_kernels_interpret.py: every ``case_*`` runs in one child process
(this file executed as a script, the interpreter switched on before Triton is imported) and
reports back as JSON. Inputs are fresh random draws (seed printed on failure), never zeros.

The kernels round where the references round, so fp32 and fp16 are held to a few ulps and
fewer than 1% of the fp16 elements may differ at all. The
interpreter converts fp32 to bf16 by truncation (the GPU rounds to nearest), so bf16 gets the
usual 1e-2 here; tests/test_kernels_fused_gpu.py holds it to an ulp on the GPU.
"""

from __future__ import annotations

import sys

import pytest

try:
    from tests.interpret_child import check_case, list_cases, run_cases, run_interpreted
except ImportError:  # run as the interpreted child script: tests/ is sys.path[0]
    from interpret_child import check_case, list_cases, run_cases, run_interpreted

TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
MAX_DIFFERING = 0.01  # fp16 elements not bit-equal (a skipped rounding step changes ~25%)
ROWS = (1, 5, 37)


# ----------------------------------------------------------------------------- helpers (child)


def _dtypes():
    import torch

    return (torch.float32, torch.float16, torch.bfloat16)


def _check(out, ref, what: str, exact: bool = False) -> None:
    import torch

    assert out.shape == ref.shape and out.dtype == ref.dtype, \
        f"{what}: {tuple(out.shape)} {out.dtype} vs {tuple(ref.shape)} {ref.dtype}"
    o, r = out.double(), ref.double()
    assert bool(torch.isfinite(o).all()), f"{what}: non-finite output"
    name = str(ref.dtype).removeprefix("torch.")
    if exact and ref.dtype != torch.bfloat16:
        assert torch.equal(out, ref), f"{what}: not bit-equal, max diff {(o - r).abs().max()}"
        return
    err = float((o - r).norm() / r.norm())
    assert err < TOL[name], f"{what}: rel err {err:.2e}"
    if ref.dtype == torch.float16:  # same rounding steps: only the odd last bit may differ
        differ = float((out != ref).float().mean())
        assert differ < MAX_DIFFERING, f"{what}: {differ:.1%} of the elements differ"


def _cos_sin(max_pos: int, d: int):
    """Rotary tables as the model builds them (fp32, theta 10000)."""
    import torch

    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)  # (P, d/2)
    return freqs.cos(), freqs.sin()


# ------------------------------------------------------------------------------ cases (child)


def case_rms_norm():
    """Hidden sizes 576 / 960 / 4096 (one program per row), 9000 (two chunks), head dims
    64 / 128 as (T, H, D) (several rows per program), 1..37 rows, a strided input."""
    import torch

    from edge_llm.kernels.fused import rms_norm, rms_norm_ref

    for dtype in _dtypes():
        for n, rows in ((576, ROWS), (960, ROWS), (4096, (1, 3)), (9000, (2,))):
            for m in rows:
                x = (torch.randn(m, n) * 3).to(dtype)
                w = (torch.rand(n) + 0.5).to(dtype)
                eps = float(torch.rand(()) * 1e-5 + 1e-6)
                _check(rms_norm(x, w, eps), rms_norm_ref(x, w, eps), f"rms n={n} m={m} {dtype}")
        for d, (t, h) in ((64, (37, 3)), (128, (5, 7))):  # qk-norm: rows of one head
            x = torch.randn(t, h, d).to(dtype)
            w = (torch.rand(d) + 0.5).to(dtype)
            _check(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), f"qk-norm d={d} {dtype}")
        big = torch.randn(7, 1000).to(dtype)  # rows of 960 with a row stride of 1000
        w = torch.randn(960).to(dtype)
        _check(rms_norm(big[:, :960], w, 1e-5), rms_norm_ref(big[:, :960], w, 1e-5),
               f"strided {dtype}")


def case_add_rms_norm():
    """The new residual is bit-equal to residual + x (fp32, fp16); the norm of it as above."""
    import torch

    from edge_llm.kernels.fused import add_rms_norm, add_rms_norm_ref

    for dtype in _dtypes():
        for n, m in ((576, 1), (576, 37), (960, 5), (4096, 2), (9000, 3), (64, 37)):
            x = torch.randn(m, n).to(dtype)
            r = (torch.randn(m, n) * 4).to(dtype)
            w = (torch.rand(n) + 0.5).to(dtype)
            out, res = add_rms_norm(x, r, w, 1e-6)
            ref_out, ref_res = add_rms_norm_ref(x, r, w, 1e-6)
            _check(res, ref_res, f"residual n={n} m={m} {dtype}", exact=True)
            _check(out, ref_out, f"add-norm n={n} m={m} {dtype}")
            assert not torch.equal(res, r), "the residual input must not be updated in place"
        x = torch.randn(2, 3, 576).to(dtype)  # leading axes
        r = torch.randn(2, 3, 576).to(dtype)
        w = torch.randn(576).to(dtype)
        for got, want in zip(add_rms_norm(x, r, w, 1e-5), add_rms_norm_ref(x, r, w, 1e-5),
                             strict=True):
            _check(got, want, f"add-norm 3-D {dtype}")


def case_gather_columns():
    """kernels/gather.py: x[..., perm] for ragged widths (a partial last block), leading
    dims and a strided view; bad permutations are refused."""
    import torch

    from edge_llm.kernels.gather import gather_columns

    for shape in ((1, 4096), (5, 1100), (2, 3, 96)):
        for dtype in _dtypes():
            x = torch.randn(*shape).to(dtype)
            perm = torch.randperm(shape[-1])
            assert torch.equal(gather_columns(x, perm), x[..., perm]), (shape, dtype)
    x = torch.randn(7, 300)[:, :200]  # rows strided
    perm = torch.randperm(200)
    assert torch.equal(gather_columns(x, perm), x[:, perm])
    try:
        gather_columns(x, perm.to(torch.int32))
    except ValueError as exc:
        assert "int64" in str(exc)
    else:
        raise AssertionError("an int32 perm was accepted")


def case_norms_with_output_permutation():
    """``perm``: the normed columns come out in that order (one chunk and two), the residual
    unpermuted and bit-equal; a wrong perm is refused."""
    import torch

    from edge_llm.kernels.fused import (
        add_rms_norm,
        add_rms_norm_ref,
        rms_norm,
        rms_norm_ref,
    )

    for dtype in _dtypes():
        for n, m in ((576, 5), (9000, 2)):
            perm = torch.randperm(n)
            x = torch.randn(m, n).to(dtype)
            r = (torch.randn(m, n) * 4).to(dtype)
            w = (torch.rand(n) + 0.5).to(dtype)
            _check(rms_norm(x, w, 1e-6, perm), rms_norm_ref(x, w, 1e-6, perm),
                   f"rms perm n={n} {dtype}")
            _check(rms_norm(x, w, 1e-6, perm), rms_norm_ref(x, w, 1e-6)[:, perm],
                   f"rms perm = gather n={n} {dtype}")
            out, res = add_rms_norm(x, r, w, 1e-6, perm)
            ref_out, ref_res = add_rms_norm_ref(x, r, w, 1e-6)
            _check(res, ref_res, f"residual perm n={n} {dtype}", exact=True)
            _check(out, ref_out[:, perm], f"add-norm perm n={n} {dtype}")
    x = torch.randn(3, 64)
    for bad in (torch.randperm(63), torch.randperm(64).to(torch.int32)):
        try:
            rms_norm(x, torch.ones(64), 1e-6, bad)
        except ValueError as exc:
            assert "perm" in str(exc)
        else:
            raise AssertionError(f"perm {bad.dtype} {tuple(bad.shape)} accepted")


def case_silu_and_mul():
    """Separate gate/up (the MLP's two linears), merged [gate | up] views, leading axes."""
    import torch

    from edge_llm.kernels.fused import silu_and_mul, silu_and_mul_ref

    for dtype in _dtypes():
        for n in (1536, 2560, 11008):
            for m in ROWS if n < 11008 else (1, 2):
                g = (torch.randn(m, n) * 4).to(dtype)  # beyond silu's bend on both sides
                u = torch.randn(m, n).to(dtype)
                _check(silu_and_mul(g, u), silu_and_mul_ref(g, u), f"silu n={n} m={m} {dtype}")
        gu = (torch.randn(5, 2 * 1100) * 3).to(dtype)
        _check(silu_and_mul(gu), silu_and_mul_ref(gu), f"merged gate_up {dtype}")
        g, u = torch.randn(2, 3, 960).to(dtype), torch.randn(2, 3, 960).to(dtype)
        _check(silu_and_mul(g, u), silu_and_mul_ref(g, u), f"silu 3-D {dtype}")


def case_gelu_tanh_and_mul():
    """Gemma's MLP activation: GeLU's tanh form times up, separate and merged [gate | up],
    gates far past the bend on both sides (the exponential saturates, no inf / NaN). Where
    gelu(g) is below 1e-3 (g < -3) the kernel's g sigmoid(2 y) keeps digits that torch's
    0.5 g (1 + tanh(y)) cancels away, so the bit-equality count skips those elements."""
    import torch

    from edge_llm.kernels.fused import gelu_tanh_and_mul, gelu_tanh_and_mul_ref

    def check(out, ref, what):
        assert out.dtype == ref.dtype and bool(torch.isfinite(out).all()), what
        err = float((out.double() - ref.double()).norm() / ref.double().norm())
        assert err < TOL[str(ref.dtype).removeprefix("torch.")], f"{what}: rel err {err:.2e}"
        if ref.dtype == torch.float16:
            differ = float(((out != ref) & (ref.float().abs() >= 1e-3)).float().mean())
            assert differ < MAX_DIFFERING, f"{what}: {differ:.1%} of the elements differ"

    for dtype in _dtypes():
        for m in (1, 3):
            g = (torch.randn(m, 1536) * 6).to(dtype)
            g[0, :4] = torch.tensor([-60.0, -9.0, 9.0, 60.0])
            u = torch.randn(m, 1536).to(dtype)
            check(gelu_tanh_and_mul(g, u), gelu_tanh_and_mul_ref(g, u), f"gelu m={m} {dtype}")
        gu = (torch.randn(5, 2 * 1100) * 3).to(dtype)
        check(gelu_tanh_and_mul(gu), gelu_tanh_and_mul_ref(gu), f"merged gelu {dtype}")


def case_rotary():
    """Head dims 64/128 (and 24: a padded half), GQA 1/3/4/8, odd head counts, 1..37 tokens,
    random positions, q and k as strided views of one qkv projection."""
    import torch

    from edge_llm.kernels.rotary import rotary, rotary_ref

    shapes = ((64, 9, 3), (128, 32, 8), (128, 28, 4), (64, 4, 4), (24, 6, 2))
    for dtype in _dtypes():
        for d, h, hkv in shapes:
            cos, sin = _cos_sin(4096, d)
            for t in ROWS:
                qkv = torch.randn(t, (h + 2 * hkv) * d).to(dtype)
                q = qkv[:, :h * d].view(t, h, d)  # (T, H, D), row stride (H + 2 Hkv) D
                k = qkv[:, h * d:(h + hkv) * d].view(t, hkv, d)
                pos = torch.randint(0, 4096, (t,))
                got, want = rotary(q, k, cos, sin, pos), rotary_ref(q, k, cos, sin, pos)
                for g, r, name in zip(got, want, "qk", strict=True):
                    _check(g, r, f"rotary {name} d={d} H={h}/{hkv} T={t} {dtype}")
                    assert g.is_contiguous()
        cos, sin = _cos_sin(64, 128)  # int32 positions, contiguous inputs
        q, k = torch.randn(3, 8, 128).to(dtype), torch.randn(3, 1, 128).to(dtype)
        pos = torch.tensor([63, 0, 17], dtype=torch.int32)
        for g, r in zip(rotary(q, k, cos, sin, pos), rotary_ref(q, k, cos, sin, pos.long()),
                        strict=True):
            _check(g, r, f"rotary int32 positions {dtype}")


CASES = list_cases(globals())


# ------------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    return run_interpreted(__file__, tmp_path_factory.mktemp("interp_fused"))


@pytest.mark.parametrize("case", CASES)
def test_fused_kernel_matches_reference_in_interpreter(report, case):
    check_case(report, case)


if __name__ == "__main__":  # the interpreted child (run_interpreted)
    run_cases(sys.argv[1], globals(), CASES)
