"""The Triton kernels a merged layer feeds strided views to (qk-norm, rotary, write_kv,
silu_and_mul), under TRITON_INTERPRET=1, against their references on the same views.

A merged qkv_proj output (T, (H + 2 Hkv) D) is split into q/k/v views with a token stride of
(H + 2 Hkv) D; gate_up_proj's (T, 2I) into halves with a row stride of 2I. The kernels must read
those strides directly (no copy on the CUDA path) and compute what the references compute.
Same child-process pattern as tests/test_kernels_fused_interpret.py; fresh random inputs.
"""

from __future__ import annotations

import sys

import pytest

try:
    from tests.interpret_child import check_case, list_cases, run_cases, run_interpreted
except ImportError:  # run as the interpreted child script: tests/ is sys.path[0]
    from interpret_child import check_case, list_cases, run_cases, run_interpreted

# the interpreter converts fp32 to bf16 by truncation (the GPU rounds to nearest): a bias of up
# to an ulp per rounding step, ~1e-2 over a short row; tests/test_kernels_fused_gpu.py holds
# bf16 to an ulp on the GPU
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}
# (head dim, query heads, kv heads): GQA 3:1, Qwen-like 7:1 (odd count), MHA, a padded half
SHAPES = ((64, 9, 3), (128, 7, 1), (32, 4, 4), (24, 6, 2))
TOKENS = (1, 5, 19)


def _check(out, ref, what: str) -> None:
    import torch

    assert out.shape == ref.shape and out.dtype == ref.dtype, \
        f"{what}: {tuple(out.shape)} {out.dtype} vs {tuple(ref.shape)} {ref.dtype}"
    o, r = out.double(), ref.double()
    assert bool(torch.isfinite(o).all()), f"{what}: non-finite output"
    err = float((o - r).norm() / r.norm())
    assert err < TOL[str(ref.dtype).removeprefix("torch.")], f"{what}: rel err {err:.2e}"


def _split_qkv(t: int, h: int, hkv: int, d: int, dtype):
    """q, k, v views of one random merged projection output, as Attention.forward splits it."""
    import torch

    qkv = (torch.randn(t, (h + 2 * hkv) * d) * 2).to(dtype).view(t, h + 2 * hkv, d)
    return qkv.split((h, hkv, hkv), dim=1)  # (T, H, D), (T, Hkv, D), (T, Hkv, D)


def _dtypes():
    import torch

    return (torch.float32, torch.float16, torch.bfloat16)


def case_qk_norm_on_views():
    """rms_norm over the heads of q/k views: the two-stride row path, not a copy."""
    import torch

    from edge_llm.kernels import fused

    for dtype in _dtypes():
        for d, h, hkv in SHAPES:
            for t in TOKENS:
                q, k, _ = _split_qkv(t, h, hkv, d, dtype)
                for x in (q, k):  # one head per token flattens to (T, D) as a view
                    assert fused._head_rows(x) == (x.shape[1] > 1)
                w = (torch.rand(d) + 0.5).to(dtype)
                for x, name in ((q, "q"), (k, "k")):
                    got = fused.rms_norm(x, w, 1e-6)
                    _check(got, fused.rms_norm_ref(x, w, 1e-6), f"{name}-norm d={d} T={t} "
                           f"H={h}/{hkv} {dtype}")
                    assert got.is_contiguous()
                    _check(got, fused.rms_norm(x.contiguous(), w, 1e-6), "view vs contiguous")
        x = torch.randn(3, 4, 9000).to(dtype)[:, :2]  # rows over two chunks, head stride 9000
        w = torch.randn(9000).to(dtype)
        _check(fused.rms_norm(x, w, 1e-5), fused.rms_norm_ref(x, w, 1e-5), f"chunked {dtype}")


def case_rotary_and_write_kv_on_views():
    """A merged attention step without qk-norm: rotary reads the q/k views, write_kv the
    rotated k and the v view; the cache ends up as the references leave it."""
    import torch

    from edge_llm.kernels.paged_attention import write_kv, write_kv_ref
    from edge_llm.kernels.rotary import rotary, rotary_ref

    for dtype in _dtypes():
        for d, h, hkv in SHAPES:
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
            freqs = torch.outer(torch.arange(512, dtype=torch.float32), inv_freq)  # (P, D/2)
            cos, sin = freqs.cos(), freqs.sin()
            for t in TOKENS:
                q, k, v = _split_qkv(t, h, hkv, d, dtype)
                pos = torch.randint(0, 512, (t,))
                (qr, kr), (q_ref, k_ref) = (rotary(q, k, cos, sin, pos),
                                            rotary_ref(q, k, cos, sin, pos))
                _check(qr, q_ref, f"rotary q d={d} T={t} {dtype}")
                _check(kr, k_ref, f"rotary k d={d} T={t} {dtype}")
                bs = 8
                kc, vc = torch.randn(2, 6, bs, hkv, d).to(dtype)
                kc_ref, vc_ref = kc.clone(), vc.clone()
                slots = torch.randperm(6 * bs)[:t]
                if t > 1:
                    slots[1] = -1  # a padding token: skipped
                assert v.stride(0) == (h + 2 * hkv) * d
                write_kv(kr, v, kc, vc, slots)
                write_kv_ref(kr, v, kc_ref, vc_ref, slots)
                assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref), \
                    f"write_kv d={d} T={t} {dtype}"


def case_rotary_write_kv_one_launch():
    """kernels/rotary_kv.py on the merged views: the rotated q equals rotary_ref's, and the
    cache equals rotary_ref + write_kv_ref's (rotated k, v copied), padding slots untouched,
    the other slots' previous contents kept; the dispatcher's CPU fallback agrees."""
    import torch

    from edge_llm.kernels import rotary_write_kv as dispatched
    from edge_llm.kernels.paged_attention import write_kv_ref
    from edge_llm.kernels.rotary import rotary_ref
    from edge_llm.kernels.rotary_kv import rotary_write_kv

    for dtype in _dtypes():
        for d, h, hkv in SHAPES:
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
            freqs = torch.outer(torch.arange(512, dtype=torch.float32), inv_freq)
            cos, sin = freqs.cos(), freqs.sin()
            for t in TOKENS:
                q, k, v = _split_qkv(t, h, hkv, d, dtype)
                pos = torch.randint(0, 512, (t,))
                bs = 8
                kc, vc = torch.randn(2, 6, bs, hkv, d).to(dtype)
                caches = [(kc.clone(), vc.clone()) for _ in range(3)]
                slots = torch.randperm(6 * bs)[:t]
                if t > 1:
                    slots[1] = -1  # a padding token: nothing stored
                qr = rotary_write_kv(q, k, v, cos, sin, pos, *caches[0], slots)
                q_ref, k_ref = rotary_ref(q, k, cos, sin, pos)
                write_kv_ref(k_ref, v, *caches[1], slots)
                what = f"d={d} H={h}/{hkv} T={t} {dtype}"
                _check(qr, q_ref, f"rotary_write_kv q {what}")
                assert qr.is_contiguous()
                _check(caches[0][0], caches[1][0], f"k cache {what}")
                assert torch.equal(caches[0][1], caches[1][1]), f"v cache {what}"
                untouched = torch.ones(6 * bs, dtype=torch.bool)
                untouched[slots[slots >= 0]] = False
                assert torch.equal(caches[0][0].view(6 * bs, hkv, d)[untouched],
                                   kc.view(6 * bs, hkv, d)[untouched]), f"other slots {what}"
                q_cpu = dispatched(q, k, v, cos, sin, pos, *caches[2], slots)  # references
                assert torch.equal(q_cpu, q_ref) and torch.equal(caches[2][0], caches[1][0])


def case_silu_and_mul_on_merged_gate_up():
    """silu_and_mul of a merged (T, 2I) output, and of its two halves passed as views."""
    import torch

    from edge_llm.kernels.fused import silu_and_mul, silu_and_mul_ref

    for dtype in _dtypes():
        for inter in (96, 1100, 2560):
            for t in TOKENS:
                gu = (torch.randn(t, 2 * inter) * 4).to(dtype)
                want = silu_and_mul_ref(gu[:, :inter].contiguous(), gu[:, inter:].contiguous())
                _check(silu_and_mul(gu), want, f"merged I={inter} T={t} {dtype}")
                _check(silu_and_mul(gu[:, :inter], gu[:, inter:]), want,
                       f"halves I={inter} T={t} {dtype}")
                _check(silu_and_mul_ref(gu), want, f"reference merged I={inter} {dtype}")


CASES = list_cases(globals())


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    return run_interpreted(__file__, tmp_path_factory.mktemp("interp_merged"))


@pytest.mark.parametrize("case", CASES)
def test_kernels_on_merged_views_in_interpreter(report, case):
    check_case(report, case)


def test_qk_norm_on_views_compiles_once_per_model():
    """The two-stride qk-norm path (Qwen3-8B heads: 32 q, 8 kv, D 128) compiled for sm_89
    without a GPU: one build per (q or k) launch shape whatever the token count, and it fits."""
    import torch

    compile_check = pytest.importorskip("tests.test_kernels_compile")
    from edge_llm.kernels import fused

    h, hkv, d = 32, 8, 128
    with compile_check.compile_only(compile_check.ARCH) as records:
        for dtype in (torch.float16, torch.bfloat16):
            w = torch.randn(d).to(dtype)
            for t in (1, 37, 256):
                q, k, _ = torch.randn(t, (h + 2 * hkv) * d).to(dtype).view(
                    t, h + 2 * hkv, d).split((h, hkv, hkv), dim=1)
                fused.rms_norm(q, w, 1e-6)
                fused.rms_norm(k, w, 1e-6)
    builds: dict[str, set[str]] = {}
    for name, kwargs, kern in records:
        key = str((name, sorted((k, str(v)) for k, v in kwargs.items()), kern.src.signature))
        builds.setdefault(key, set()).add(str(kern.src.attrs))
    assert {kw["INNER_ROWS"] for _, kw, _ in records} == {h, hkv}
    assert len(builds) == 4 and all(len(v) == 1 for v in builds.values()), builds
    compile_check._assert_fits(records)


if __name__ == "__main__":  # the interpreted child (run_interpreted)
    run_cases(sys.argv[1], globals(), CASES)
