"""The paged decode kernel as a CUDA graph runs it, under TRITON_INTERPRET=1 on the CPU.

A captured decode graph sizes its context split from ``max_model_len`` (a fixed grid), so most
context partitions of a short sequence are empty (partition start >= seq_len), and padding rows
(seq_len 1, block 0, slot -1) ride along. Both must leave the real rows exact. As in
tests/test_kernels_interpret.py, every case runs in one child process started with the
interpreter on, on fresh random inputs (the seed is reported on failure).
"""

from __future__ import annotations

import sys

import pytest

try:
    import tests.interpret_child as ic
except ImportError:  # run as the interpreted child script: tests/ is sys.path[0]
    import interpret_child as ic


# ----------------------------------------------------------------------------- helpers (child)


def _cache(num_blocks, bs, hkv, d, dtype):
    import torch

    return (torch.randn(num_blocks, bs, hkv, d).to(dtype),
            torch.randn(num_blocks, bs, hkv, d).to(dtype))


def _tables(ctx, bs, num_blocks, width):
    """Distinct random blocks per sequence (block 0 kept out), padded with random valid ids."""
    import torch

    perm = torch.randperm(num_blocks - 1) + 1
    table = torch.randint(1, num_blocks, (len(ctx), width), dtype=torch.int32)
    start = 0
    for i, c in enumerate(ctx):
        used = -(-c // bs)
        table[i, :used] = perm[start:start + used].to(torch.int32)
        start += used
    return table


def _decode_vs_ref(ctx, h, hkv, d, bs, dtype, max_model_len, cfg):
    import torch

    from edge_llm.kernels.paged_attention import paged_attention_ref, paged_decode

    width = -(-max_model_len // bs)
    kc, vc = _cache(sum(-(-c // bs) for c in ctx) + 4, bs, hkv, d, dtype)
    table = _tables(ctx, bs, kc.shape[0], width)
    q = torch.randn(len(ctx), h, d).to(dtype)
    sl = torch.tensor(ctx, dtype=torch.int32)
    qsl = torch.arange(len(ctx) + 1, dtype=torch.int32)
    out = paged_decode(q, kc, vc, table, sl, d ** -0.5, max_model_len, cfg)
    ref = paged_attention_ref(q, kc, vc, table, qsl, sl, d ** -0.5)
    err = ic.rel_err(out, ref)
    tol = ic.tolerance(dtype)
    assert err < tol, f"ctx={ctx} H={h}/{hkv} max_model_len={max_model_len} {cfg}: {err:.2e}"


# ------------------------------------------------------------------------------ cases (child)


def case_empty_partitions():
    """Split sized for max_model_len: sequences of 1..70 tokens, each partition sized from its own
    length (1 token: one 16-token partition, 7 empty), so some partitions are still empty."""
    import torch

    from edge_llm.kernels.paged_attention import DecodeConfig, decode_split_plan

    cfg = DecodeConfig(block_n=16, num_splits=8)
    splits, part = decode_split_plan(4 * 2, 512, 8, cfg.block_n, cfg.num_splits)
    assert splits == 8 and part == 64, (splits, part)
    _decode_vs_ref([1, 17, 40, 70], 4, 2, 32, 8, torch.float32, 512, cfg)
    # GQA 4, fp16, block 16: a sequence ending exactly on a partition boundary (64)
    _decode_vs_ref([64, 3, 65], 8, 2, 16, 16, torch.float16, 512, cfg)
    # the automatic split (8 "multiprocessors" in the interpreter) for a long max_model_len
    _decode_vs_ref([5, 33], 6, 3, 16, 16, torch.float32, 2048, DecodeConfig(block_n=16))


def case_padded_graph_batch():
    """A decode step laid out as the graph runner pads it: rows B..bs-1 are padding (slot -1,
    seq_len 1, block 0). write_kv must skip them; the real rows must equal the unpadded
    reference, and padding rows must stay finite."""
    import torch

    from edge_llm.kernels.paged_attention import (
        DecodeConfig,
        paged_attention_ref,
        paged_decode,
        write_kv,
    )

    h, hkv, d, bs, max_model_len, padded = 4, 2, 32, 8, 256, 8
    ctx = [9, 24, 1]
    b = len(ctx)
    width = -(-max_model_len // bs)
    kc, vc = _cache(sum(-(-c // bs) for c in ctx) + 3, bs, hkv, d, torch.float32)
    table = torch.zeros(padded, width, dtype=torch.int32)
    table[:b] = _tables(ctx, bs, kc.shape[0], width)
    seq_lens = torch.ones(padded, dtype=torch.int32)
    seq_lens[:b] = torch.tensor(ctx, dtype=torch.int32)
    slots = torch.full((padded,), -1, dtype=torch.int64)
    for i, c in enumerate(ctx):  # the new token sits at position c - 1
        slots[i] = int(table[i, (c - 1) // bs]) * bs + (c - 1) % bs
    k_new, v_new = torch.randn(padded, hkv, d), torch.randn(padded, hkv, d)
    q = torch.randn(padded, h, d)
    block0 = kc[0].clone(), vc[0].clone()
    write_kv(k_new, v_new, kc, vc, slots)
    assert torch.equal(kc[0], block0[0]) and torch.equal(vc[0], block0[1]), "padding wrote"
    out = paged_decode(q, kc, vc, table, seq_lens, d ** -0.5, max_model_len,
                       DecodeConfig(block_n=16, num_splits=4))
    assert bool(out.isfinite().all()), "padding rows are not finite"
    qsl = torch.arange(b + 1, dtype=torch.int32)
    ref = paged_attention_ref(q[:b], kc, vc, table[:b], qsl, seq_lens[:b], d ** -0.5)
    err = ic.rel_err(out[:b], ref)
    assert err < ic.tolerance(torch.float32), f"padded batch: rel err {err:.2e}"
    for i, c in enumerate(ctx):  # the new token's K/V is in the cache where the reference read it
        blk, off = int(table[i, (c - 1) // bs]), (c - 1) % bs
        assert torch.equal(kc[blk, off], k_new[i]) and torch.equal(vc[blk, off], v_new[i])


CASES = ic.list_cases(globals())


# ------------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    return ic.run_interpreted(__file__, tmp_path_factory.mktemp("interp"))


@pytest.mark.parametrize("case", CASES)
def test_decode_kernel_under_graph_layout(report, case):
    ic.check_case(report, case)


if __name__ == "__main__":  # the interpreted child (run_interpreted)
    ic.run_cases(sys.argv[1], globals(), CASES)
