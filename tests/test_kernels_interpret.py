"""The attention and KV-write Triton kernels vs their torch references on the CPU, under
TRITON_INTERPRET=1 (the W4A16 kernels: tests/test_w4a16_interpret.py).

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


def _paged_problem(nq, ctx, h, hkv, d, bs, dtype):
    """Random cache with non-contiguous block ids; padded tables; host query_start_loc."""
    import torch

    nblk = [-(-c // bs) for c in ctx]
    total = sum(nblk) + 5
    perm = torch.randperm(total).to(torch.int32)
    table = torch.full((len(ctx), max(nblk) + 2), int(perm[-1]), dtype=torch.int32)
    start = 0
    for i, used in enumerate(nblk):
        table[i, :used] = perm[start:start + used]
        start += used
    kc = torch.randn(total, bs, hkv, d).to(dtype)
    vc = torch.randn(total, bs, hkv, d).to(dtype)
    qsl = torch.tensor([0] + list(nq)).cumsum(0).to(torch.int32)
    q = torch.randn(int(qsl[-1]), h, d).to(dtype)
    return q, kc, vc, table, qsl, torch.tensor(ctx, dtype=torch.int32)


def _check_attention(nq, ctx, h, hkv, d, bs, dtype, decode_cfg=None, prefill_cfg=None,
                     **kw):
    """``kw``: ``window`` / ``softcap``, passed to the reference and the kernel alike."""
    from edge_llm.kernels.paged_attention import (
        paged_attention_ref,
        paged_attention_triton,
        paged_decode,
        paged_prefill,
    )

    q, kc, vc, table, qsl, sl = _paged_problem(nq, ctx, h, hkv, d, bs, dtype)
    scale = d ** -0.5
    ref = paged_attention_ref(q, kc, vc, table, qsl, sl, scale, **kw)
    if all(n == 1 for n in nq):
        out = paged_decode(q, kc, vc, table, sl, scale, max(ctx), decode_cfg, **kw)
    elif prefill_cfg is not None:
        out = paged_prefill(q, kc, vc, table, qsl, sl, scale, prefill_cfg, **kw)
    else:
        out = paged_attention_triton(q, kc, vc, table, qsl, sl, scale, **kw)
    err = ic.rel_err(out, ref)
    assert err < ic.tolerance(dtype), (f"nq={nq} ctx={ctx} H={h}/{hkv} D={d} bs={bs} {kw}: "
                                       f"rel err {err:.2e}")
    return out, ref


# ------------------------------------------------------------------------------ cases (child)


def case_decode_gqa_ratios():
    import torch

    from edge_llm.kernels.paged_attention import DecodeConfig

    _check_attention([1] * 3, [1, 17, 40], 3, 3, 32, 8, torch.float32)  # GQA 1, odd heads
    _check_attention([1] * 2, [70, 33], 6, 3, 16, 16, torch.float32,
                     DecodeConfig(block_n=16, num_splits=3))  # GQA 2, splits summed in-kernel
    _check_attention([1] * 2, [70, 33], 6, 3, 16, 16, torch.float32,
                     DecodeConfig(block_n=16, num_splits=3, fused_reduce=False))  # 2nd launch
    _check_attention([1] * 2, [100, 40], 6, 3, 16, 16, torch.float32,
                     DecodeConfig(block_n=16, num_splits=6, max_fused_splits=4))  # 2nd launch
    _check_attention([1] * 3, [100, 40, 3], 6, 3, 16, 16, torch.float16,
                     DecodeConfig(block_n=16, num_splits=6, max_fused_splits=16))  # 6 summed
    _check_attention([1] * 3, [33, 64, 5], 12, 3, 24, 16, torch.float16,
                     DecodeConfig(block_n=16, num_splits=2))  # GQA 4, head_dim 24 padded
    _check_attention([1] * 2, [100, 7], 8, 1, 32, 32, torch.float32,
                     DecodeConfig(block_n=32, num_splits=0))  # GQA 8


def case_prefill_chunked_and_mixed():
    import torch

    from edge_llm.kernels.paged_attention import PrefillConfig

    cfg = PrefillConfig(block_m=16, block_n=16)
    # prefix + chunk, a decode row, a pure prefill; GQA 1, block size 8
    _check_attention([5, 1, 12], [20, 9, 12], 4, 4, 32, 8, torch.float32, prefill_cfg=cfg)
    # GQA 8, block 32, a sequence with no new query, partial last blocks
    _check_attention([3, 0, 40], [35, 4, 75], 8, 1, 32, 32, torch.float32, prefill_cfg=cfg)
    # GQA 2, odd head count, fp16, through the dispatcher (host query_start_loc)
    _check_attention([7, 2, 1], [30, 18, 2], 6, 3, 16, 16, torch.float16)
    # GQA 4, several q tiles per sequence
    _check_attention([21, 9], [50, 9], 12, 3, 16, 16, torch.float32,
                     prefill_cfg=PrefillConfig(block_m=32, block_n=16))


def case_prefill_split_keys():
    """Keys cut into partitions per q tile (PrefillConfig.num_splits, or planned from the
    grid and ``max_seq_len``), merged by a second launch: a few cached-prefix queries over a
    long context, partitions past a tile's last key (empty), decode rows and a fresh prompt
    in one step, GQA 1 / 4 / 7, fp32 and fp16; the planner."""

    import torch

    from edge_llm.kernels.paged_attention import (
        PrefillConfig,
        paged_attention_ref,
        paged_attention_triton,
    )
    from edge_llm.kernels.paged_prefill import MAX_SPLITS, prefill_splits

    for splits in (2, 3, 8):
        cfg = PrefillConfig(block_m=16, block_n=16, num_splits=splits)
        _check_attention([6], [200], 4, 4, 32, 16, torch.float32, prefill_cfg=cfg)
        _check_attention([5, 1, 12, 2], [130, 70, 12, 3], 8, 2, 16, 8, torch.float16,
                         prefill_cfg=cfg)
        _check_attention([9, 30], [150, 40], 7, 1, 24, 16, torch.float32,
                         prefill_cfg=PrefillConfig(block_m=32, block_n=16, num_splits=splits))
    # planned: 8 multiprocessors on the CPU, so 4 heads x 1 tile split over a long context
    assert prefill_splits(4, 2048, 8, 64) == 4 and prefill_splits(64, 2048, 8, 64) == 1
    assert prefill_splits(1, 1 << 20, 132, 64) == MAX_SPLITS
    # the cost rule on the H200 kernel table (Qwen2.5's 28 / 4 heads, 64-row q tiles of 9
    # tokens): 128 new tokens over 1,000 keys split 4 ways (1.28x); 256 over 1,000 kept
    # whole (3 ways lost: 0.78x); 256 over 4,000 split (1.17x); a short context kept whole
    assert prefill_splits(15 * 4, 1000, 132, 64, rows=128 * 28) == 4
    assert prefill_splits(29 * 4, 1000, 132, 64, rows=256 * 28) == 1
    assert prefill_splits(29 * 4, 4000, 132, 64, rows=256 * 28) == 3
    assert prefill_splits(4, 300, 132, 64, rows=8 * 28) == 1
    assert prefill_splits(4, 2048, 8, 64, 3) == 3  # a configured split is taken as it is
    nq, ctx = [3], [1100]
    q, kc, vc, table, qsl, sl = _paged_problem(nq, ctx, 4, 4, 16, 16, torch.float16)
    ref = paged_attention_ref(q, kc, vc, table, qsl, sl, 0.25)
    out = paged_attention_triton(q, kc, vc, table, qsl, sl, 0.25, max_query_len=3,
                                 max_seq_len=4096)
    assert ic.rel_err(out, ref) < ic.tolerance(torch.float16)


def case_prefill_groups_not_a_power_of_two():
    """Prefill rows are token * G + head for any GQA group G (3 / 5 / 6 / 7 here: a q tile
    of 16 rows holds 5 / 3 / 2 / 2 tokens, the last rows idle), alone and with split keys,
    also through the dispatcher."""
    import torch

    from edge_llm.kernels.paged_attention import PrefillConfig

    for group in (3, 5, 6, 7):
        for splits in (1, 3):
            cfg = PrefillConfig(block_m=16, block_n=16, num_splits=splits)
            _check_attention([5, 1, 12], [40, 9, 12], 2 * group, 2, 16, 8, torch.float32,
                             prefill_cfg=cfg)
    _check_attention([7, 2, 1], [30, 18, 2], 14, 2, 16, 16, torch.float16)


def case_prefill_short_step_graph_layout():
    """engine/prefill_graphs.py's layout: real sequences, then empty slots (no queries,
    seq_len 0), then the padding sequence; query_start_loc on the device side and
    max_query_len = T, as a captured short step passes them."""
    import torch

    from edge_llm.kernels.paged_attention import paged_attention_ref, paged_attention_triton

    for nq, ctx in (([5, 1, 0, 0, 0, 2], [20, 9, 0, 0, 0, 2]),  # a prompt, a decode row
                    ([1, 1, 0, 6], [12, 30, 0, 6]),  # decode rows only, then padding
                    ([3, 4, 0, 0, 0], [3, 40, 0, 0, 0])):  # no padding rows
        q, kc, vc, table, qsl, sl = _paged_problem(nq, ctx, 4, 2, 16, 8, torch.float16)
        ref = paged_attention_ref(q, kc, vc, table, qsl, sl, 0.25)
        out = paged_attention_triton(q, kc, vc, table, qsl, sl, 0.25,
                                     max_query_len=q.shape[0], max_seq_len=64)
        assert ic.rel_err(out, ref) < ic.tolerance(torch.float16), (nq, ctx)


def case_prefill_tile_table_kept_for_the_next_layers():
    """``scratch`` (AttentionMetadata.scratch): the first layer's tile table serves the next
    layers of the step (fresh q and caches, same sequences), and it is really the one used."""
    import torch

    from edge_llm.kernels.paged_attention import paged_attention_ref, paged_attention_triton

    nq, ctx = [5, 1, 12], [20, 9, 12]
    scratch: dict = {}
    for layer in range(3):
        q, kc, vc, table, qsl, sl = _paged_problem(nq, ctx, 4, 2, 16, 8, torch.float16)
        if layer == 0:
            keep = (table, qsl, sl)
        table, qsl, sl = keep  # one step: the same sequences in every layer
        ref = paged_attention_ref(q, kc, vc, table, qsl, sl, 0.25)
        out = paged_attention_triton(q, kc, vc, table, qsl, sl, 0.25, max_query_len=12,
                                     max_seq_len=20, scratch=scratch)
        assert ic.rel_err(out, ref) < ic.tolerance(torch.float16), layer
        assert len(scratch) == 1, scratch.keys()
    (key, (kept_qsl, tile_starts)), = scratch.items()
    tile_starts.zero_()  # every tile now belongs to the last sequence: not the right answer
    out = paged_attention_triton(q, kc, vc, table, qsl, sl, 0.25, max_query_len=12,
                                 max_seq_len=20, scratch=scratch)
    assert not torch.allclose(out.float().nan_to_num(), ref.float(), atol=1e-2)


def case_dispatch_without_host_read():
    """Device-style query_start_loc: T == B means decode; hints pick the path directly."""
    import torch

    from edge_llm.kernels.paged_attention import paged_attention_ref, paged_attention_triton

    q, kc, vc, table, qsl, sl = _paged_problem([1, 1, 1], [9, 30, 16], 4, 2, 16, 8,
                                               torch.float32)
    ref = paged_attention_ref(q, kc, vc, table, qsl, sl, 0.3)
    out = paged_attention_triton(q, kc, vc, table, qsl, sl, 0.3, max_query_len=1,
                                 max_seq_len=30)
    assert ic.rel_err(out, ref) < ic.tolerance(torch.float32)
    q, kc, vc, table, qsl, sl = _paged_problem([4, 2], [6, 20], 4, 2, 16, 8, torch.float32)
    out = paged_attention_triton(q, kc, vc, table, qsl, sl, 0.3, max_query_len=4)
    ref = paged_attention_ref(q, kc, vc, table, qsl, sl, 0.3)
    assert ic.rel_err(out, ref) < ic.tolerance(torch.float32)


def case_stale_slots_never_reach_the_outputs():
    """Keys are gathered by whole blocks (paged_common.load_k_tile): the slots past each
    context's end in its last block are read too. Filled with NaN there (and in the
    values, gathered per token), they must not reach any output: decode with and without
    splits, block sizes 8-32 against key tiles of 16-64, prefill with a split."""
    import torch

    from edge_llm.kernels.paged_attention import (
        DecodeConfig,
        PrefillConfig,
        paged_attention_ref,
        paged_decode,
        paged_prefill,
    )

    for nq, ctx, bs, block_n, splits in (([1, 1, 1], [37, 5, 70], 16, 64, 1),
                                         ([1, 1], [45, 20], 32, 16, 3),
                                         ([1, 1], [13, 30], 8, 32, 2),
                                         ([3, 9], [29, 9], 16, 16, 0),
                                         ([6, 1], [90, 41], 32, 16, 2)):
        q, kc, vc, table, qsl, sl = _paged_problem(nq, ctx, 4, 2, 32, bs, torch.float32)
        ref = paged_attention_ref(q, kc, vc, table, qsl, sl, 0.2)
        for b, n in enumerate(ctx):  # past the context: NaN in the blocks it owns
            blocks = table[b, :-(-n // bs)].long()
            last = blocks[-1]
            kc[last, n - (len(blocks) - 1) * bs:] = float("nan")
            vc[last, n - (len(blocks) - 1) * bs:] = float("nan")
        if all(x == 1 for x in nq):
            out = paged_decode(q, kc, vc, table, sl, 0.2, max(ctx),
                               DecodeConfig(block_n=block_n, num_splits=splits))
        else:
            out = paged_prefill(q, kc, vc, table, qsl, sl, 0.2,
                                PrefillConfig(block_n=block_n, num_splits=splits))
        assert bool(torch.isfinite(out).all()), (nq, ctx, bs, block_n)
        assert ic.rel_err(out, ref) < ic.tolerance(torch.float32), (nq, ctx, bs, block_n)


def case_sliding_window_and_softcap():
    """Sliding windows (keys p - W + 1 .. p) and soft-capped scores: decode with one split,
    splits summed in the kernel and by the second launch, prefill chunks and decode rows in
    one step, keys split per q tile; windows shorter than, equal to and longer than a key
    tile, contexts past them, GQA 2 / 4; a window wider than the context changes
    nothing. The reference with the window must differ from the one without (the cases reach
    past the windows)."""
    import torch

    from edge_llm.kernels.paged_attention import DecodeConfig, PrefillConfig

    dcfgs = (DecodeConfig(block_n=16, num_splits=1), DecodeConfig(block_n=16, num_splits=3),
             DecodeConfig(block_n=16, num_splits=3, fused_reduce=False))
    cases = ((5, None), (16, 2.0), (1, None), (300, 0.7))
    for i, (window, cap) in enumerate(cases):
        _check_attention([1] * 3, [45, 9, 60], 4, 2, 16, 8, torch.float32,
                         decode_cfg=dcfgs[i % 3], window=window, softcap=cap)
        pcfg = PrefillConfig(block_m=16, block_n=16, num_splits=(1, 3)[i % 2])
        _check_attention([5, 1, 30], [50, 41, 30], 8, 2, 16, 8, torch.float32,
                         prefill_cfg=pcfg, window=window, softcap=cap)
    _check_attention([9, 2], [60, 40], 4, 1, 32, 16, torch.float16,
                     prefill_cfg=PrefillConfig(block_m=16, block_n=16, num_splits=3),
                     window=20, softcap=2.0)
    from edge_llm.kernels.paged_attention import paged_attention_ref

    q, kc, vc, table, qsl, sl = _paged_problem([1, 1], [40, 70], 4, 2, 16, 8, torch.float32)
    full = paged_attention_ref(q, kc, vc, table, qsl, sl, 0.25)
    assert ic.rel_err(paged_attention_ref(q, kc, vc, table, qsl, sl, 0.25, window=16),
                      full) > 1e-2
    assert ic.rel_err(paged_attention_ref(q, kc, vc, table, qsl, sl, 0.25, window=70),
                      full) < 1e-6


def case_head_dim_256():
    """Gemma's head_dim 256 (GQA 2) with a window and a soft cap: decode split and not,
    prefill through the dispatcher (its head_dim-256 config), fp16 and fp32, short contexts
    (the interpreter is slow at this width)."""
    import torch

    from edge_llm.kernels.paged_attention import DecodeConfig

    for dtype in (torch.float32, torch.float16):
        for splits in (1, 2):
            _check_attention([1, 1], [40, 7], 4, 2, 256, 16, dtype,
                             decode_cfg=DecodeConfig(block_n=16, num_splits=splits),
                             window=24, softcap=1.5)
        _check_attention([6, 1], [40, 20], 4, 2, 256, 16, dtype, window=24, softcap=1.5)
        _check_attention([3], [3], 2, 1, 256, 16, dtype)


def case_write_kv():
    import torch

    from edge_llm.kernels.paged_attention import write_kv, write_kv_ref

    for bs, dtype in ((8, torch.float32), (16, torch.float16), (32, torch.float16)):
        kc = torch.randn(6, bs, 3, 24).to(dtype)
        vc = torch.randn(6, bs, 3, 24).to(dtype)
        kc_ref, vc_ref = kc.clone(), vc.clone()
        t = 9
        slots = torch.randperm(6 * bs)[:t]
        slots[2] = -1  # padding token: skipped
        k, v = torch.randn(t, 3, 24), torch.randn(t, 3, 24)  # fp32 into the cache dtype
        write_kv(k, v, kc, vc, slots)
        write_kv_ref(k, v, kc_ref, vc_ref, slots)
        assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref), f"bs={bs} {dtype}"


def case_decode_prefetch_tokens():
    """The decode kernel's L2 prefetch before its PDL wait (PREFETCH; the prefetch itself is
    PTX, so the interpreter checks the tokens): each split's tokens cover the first PREFETCH
    tiles of its part of the context, and none lies outside the context (an empty split and
    an empty context included)."""
    import torch
    import triton
    import triton.language as tl

    from edge_llm.kernels.paged_decode import _prefetch_tokens

    globals()["_prefetch_tokens"] = _prefetch_tokens  # a jit function's names are global

    @triton.jit
    def probe(lens_ptr, out_ptr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
        b, split = tl.program_id(0), tl.program_id(1)
        tok = _prefetch_tokens(tl.load(lens_ptr + b), split, tl.num_programs(1), BLOCK_N,
                               PREFETCH)
        p = b * tl.num_programs(1) + split
        tl.store(out_ptr + p * PREFETCH * BLOCK_N + tl.arange(0, PREFETCH * BLOCK_N), tok)

    lens = torch.tensor([0, 1, 63, 64, 65, 300, 1000, 4096], dtype=torch.int32)
    for block_n, prefetch, splits in ((64, 1, 8), (64, 2, 3), (32, 4, 1), (16, 1, 16)):
        width = prefetch * block_n
        out = torch.full((len(lens), splits, width), -7, dtype=torch.int32)
        probe[(len(lens), splits)](lens, out, BLOCK_N=block_n, PREFETCH=prefetch)
        for i, n in enumerate(lens.tolist()):
            per_split = (n + splits - 1) // splits  # as context_partition
            part = max((per_split + block_n - 1) // block_n, 1) * block_n
            for sp in range(splits):
                got = set(out[i, sp].tolist())
                label = f"seq_len={n} split {sp}/{splits} BLOCK_N={block_n} x{prefetch}"
                assert got and all(0 <= t < max(n, 1) for t in got), (label, sorted(got))
                start, end = sp * part, min(n, sp * part + part)
                want = set(range(start, min(end, start + width)))
                assert want <= got, (label, sorted(want - got))


CASES = ic.list_cases(globals())


# ------------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    return ic.run_interpreted(__file__, tmp_path_factory.mktemp("interp"))


@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_reference_in_interpreter(report, case):
    ic.check_case(report, case)


if __name__ == "__main__":  # the interpreted child (run_interpreted)
    ic.run_cases(sys.argv[1], globals(), CASES)
