"""The fused kernels (kernels/fused.py) at full size on a CUDA GPU (``pytest -m gpu``).

Against the torch references on the same GPU: the new residual bit-equal, the other outputs
within an ulp on fewer than 1% of the elements (the kernels round where the references round),
the dispatchers and the model's layers on the Triton path, and all four ops replayed from one
CUDA graph with fresh inputs (no host sync, grids from shapes only).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import importlib  # noqa: E402

from edge_llm.kernels import dispatch as kernels  # noqa: E402

fu = importlib.import_module("edge_llm.kernels.fused")
rot = importlib.import_module("edge_llm.kernels.rotary")


DEV = torch.device("cuda")
SHARED_LIMIT = 99 * 1024
DTYPES = [torch.float16, torch.bfloat16]
ROWS = [1, 2, 7, 16, 37, 64, 128, 255, 256]
TOL = {torch.float16: 2e-3, torch.bfloat16: 8e-3}
MAX_DIFFERING = 0.01


def check(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype, what
    assert bool(torch.isfinite(out).all()), f"{what}: non-finite output"
    o, r = out.double(), ref.double()
    err = float((o - r).norm() / r.norm())
    assert err < TOL[ref.dtype], f"{what}: rel err {err:.2e}"
    differ = float((out != ref).float().mean())
    assert differ < MAX_DIFFERING, f"{what}: {differ:.2%} of the elements differ"


def cos_sin(max_pos: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=DEV).float() / d))
    freqs = torch.outer(torch.arange(max_pos, device=DEV, dtype=torch.float32), inv_freq)
    return freqs.cos(), freqs.sin()


@pytest.fixture(autouse=True)
def shared_memory_fits():
    yield
    for module, name in ((fu, "_rms_norm_kernel"), (fu, "_silu_mul_kernel"),
                         (rot, "_rotary_kernel")):
        for cache in getattr(module, name).device_caches.values():
            for kern in cache[0].values():
                shared = int(kern.metadata.shared)
                assert shared <= SHARED_LIMIT, f"{name} uses {shared} B of shared memory"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [4096, 3584])
def test_norms_full_size(hidden, dtype):
    w = (torch.rand(hidden, device=DEV) + 0.5).to(dtype)
    for m in ROWS:
        x = torch.randn(m, hidden, device=DEV, dtype=dtype)
        r = torch.randn(m, hidden, device=DEV, dtype=dtype) * 8
        r[:, ::509] = 600.0  # residual-stream outliers, as in real 7B models
        check(kernels.rms_norm(x, w, 1e-6), fu.rms_norm_ref(x, w, 1e-6), f"rms m={m}")
        out, res = kernels.add_rms_norm(x, r, w, 1e-5)
        ref_out, ref_res = fu.add_rms_norm_ref(x, r, w, 1e-5)
        assert torch.equal(res, ref_res), f"residual m={m}"
        check(out, ref_out, f"add-norm m={m}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_with_output_permutation(dtype):
    """The act-order fold (model/fuse.py): normed columns in the next linear's order."""
    n = 4096
    perm = torch.randperm(n, device=DEV)
    w = (torch.rand(n, device=DEV) + 0.5).to(dtype)
    for m in ROWS:
        x = torch.randn(m, n, device=DEV, dtype=dtype)
        r = torch.randn(m, n, device=DEV, dtype=dtype) * 8
        check(kernels.rms_norm(x, w, 1e-6, perm), fu.rms_norm_ref(x, w, 1e-6)[:, perm],
              f"rms perm m={m}")
        out, res = kernels.add_rms_norm(x, r, w, 1e-5, perm)
        ref_out, ref_res = fu.add_rms_norm_ref(x, r, w, 1e-5)
        assert torch.equal(res, ref_res), f"residual m={m}"
        check(out, ref_out[:, perm], f"add-norm perm m={m}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_columns(dtype):
    """The act-order input gather (kernels/gather.py) equals index_select, bit for bit."""
    perm = torch.randperm(4096, device=DEV)
    for m in ROWS:
        x = torch.randn(m, 4096, device=DEV, dtype=dtype)
        assert torch.equal(kernels.gather_columns(x, perm), x.index_select(-1, perm)), m


@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_rows(dtype):
    """Qwen3's per-head norm: (T, H, 128) rows, several per program."""
    w = (torch.rand(128, device=DEV) + 0.5).to(dtype)
    for t in (1, 37, 256):
        q = torch.randn(t, 32, 128, device=DEV, dtype=dtype)
        check(kernels.rms_norm(q, w, 1e-6), fu.rms_norm_ref(q, w, 1e-6), f"qk-norm T={t}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [11008, 18944])
def test_silu_and_mul_full_size(inter, dtype):
    for m in ROWS:
        g = torch.randn(m, inter, device=DEV, dtype=dtype) * 4
        u = torch.randn(m, inter, device=DEV, dtype=dtype)
        check(kernels.silu_and_mul(g, u), fu.silu_and_mul_ref(g, u), f"silu m={m}")
    gu = torch.randn(64, 2 * inter, device=DEV, dtype=dtype) * 4
    check(kernels.silu_and_mul(gu), fu.silu_and_mul_ref(gu), "merged gate_up")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h,hkv,d", [(32, 32, 128), (28, 4, 128), (32, 8, 128), (9, 3, 64)])
def test_rotary_full_size(h, hkv, d, dtype):
    cos, sin = cos_sin(32768, d)
    for t in ROWS + [2048]:
        qkv = torch.randn(t, (h + 2 * hkv) * d, device=DEV, dtype=dtype)
        q = qkv[:, :h * d].view(t, h, d)  # strided views of one projection
        k = qkv[:, h * d:(h + hkv) * d].view(t, hkv, d)
        pos = torch.randint(0, 32768, (t,), device=DEV)
        got = kernels.rotary(q, k, cos, sin, pos)
        want = rot.rotary_ref(q, k, cos, sin, pos)
        check(got[0], want[0], f"rotary q T={t}")
        check(got[1], want[1], f"rotary k T={t}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h,hkv,d", [(32, 32, 128), (28, 4, 128), (9, 3, 64)])
def test_rotary_write_kv_full_size(h, hkv, d, dtype):
    """kernels/rotary_kv.py against rotary_ref + write_kv_ref: q, the cache (k rotated, v
    copied), padding slots (-1) not stored."""
    from edge_llm.kernels.paged_attention import write_kv_ref

    cos, sin = cos_sin(32768, d)
    bs, blocks = 16, 300
    for t in ROWS + [2048]:
        q, k, v = torch.randn(t, h + 2 * hkv, d, device=DEV, dtype=dtype).split(
            (h, hkv, hkv), dim=1)
        pos = torch.randint(0, 32768, (t,), device=DEV)
        slots = torch.randperm(blocks * bs, device=DEV)[:t]
        slots[::7] = -1
        kc, vc = torch.randn(2, blocks, bs, hkv, d, device=DEV, dtype=dtype)
        kc_ref, vc_ref = kc.clone(), vc.clone()
        got = kernels.rotary_write_kv(q, k, v, cos, sin, pos, kc, vc, slots)
        q_ref, k_ref = rot.rotary_ref(q, k, cos, sin, pos)
        write_kv_ref(k_ref, v, kc_ref, vc_ref, slots)
        check(got, q_ref, f"rotary_write_kv q T={t}")
        check(kc, kc_ref, f"rotary_write_kv k cache T={t}")
        assert torch.equal(vc, vc_ref), f"v cache T={t}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_ops_replay_in_a_cuda_graph(dtype):
    """Captured once on static buffers, replayed on new inputs copied in."""
    m, hidden, inter, h, hkv, d = 24, 4096, 11008, 32, 8, 128
    cos, sin = cos_sin(4096, d)
    w = (torch.rand(hidden, device=DEV) + 0.5).to(dtype)

    def inputs():
        return dict(x=torch.randn(m, hidden, device=DEV, dtype=dtype),
                    r=torch.randn(m, hidden, device=DEV, dtype=dtype),
                    g=torch.randn(m, inter, device=DEV, dtype=dtype),
                    u=torch.randn(m, inter, device=DEV, dtype=dtype),
                    q=torch.randn(m, h, d, device=DEV, dtype=dtype),
                    k=torch.randn(m, hkv, d, device=DEV, dtype=dtype),
                    pos=torch.randint(0, 4096, (m,), device=DEV))

    static = inputs()

    def step():
        s = static
        return (kernels.rms_norm(s["x"], w, 1e-6), *kernels.add_rms_norm(s["x"], s["r"], w, 1e-6),
                kernels.silu_and_mul(s["g"], s["u"]),
                *kernels.rotary(s["q"], s["k"], cos, sin, s["pos"]))

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            outs = step()
    for _ in range(2):
        fresh = inputs()
        for key, val in fresh.items():
            static[key].copy_(val)
        graph.replay()
        torch.cuda.synchronize()
        f = fresh
        refs = (fu.rms_norm_ref(f["x"], w, 1e-6), *fu.add_rms_norm_ref(f["x"], f["r"], w, 1e-6),
                fu.silu_and_mul_ref(f["g"], f["u"]),
                *rot.rotary_ref(f["q"], f["k"], cos, sin, f["pos"]))
        for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
            check(out, ref, f"graph output {i}")


def test_model_layers_run_the_kernels():
    """RMSNorm / MLP / rotary modules on CUDA fp16 give exactly the fused kernels' results."""
    from edge_llm.model.layers import RMSNorm

    norm = RMSNorm(4096, 1e-5).to(DEV, torch.float16)
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(5, 4096, device=DEV, dtype=torch.float16)
    r = torch.randn_like(x)
    with torch.inference_mode():
        assert torch.equal(norm(x), fu.rms_norm(x, norm.weight, 1e-5))
        got, want = norm.add_forward(x, r), fu.add_rms_norm(x, r, norm.weight, 1e-5)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
