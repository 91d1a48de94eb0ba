"""Short-step CUDA graphs (engine/prefill_graphs.py), the pure logic: eligibility, the padded
layout of a step's rows over the buckets' sequence slots, the buckets. The padded
forward and the engine's routing: tests/test_prefill_graphs.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from edge_llm.engine.prefill_graphs import (
    PREFILL_SIZES,
    is_short_step,
    num_slots,
    prefill_inputs,
    prefill_sizes,
)

BLOCK = 8


def _row(tokens, start, table, prompt_logprobs=None, num_prompt=1000, do_sample=True):
    params = SimpleNamespace(prompt_logprobs=prompt_logprobs)
    seq = SimpleNamespace(params=params, num_prompt_tokens=num_prompt)
    return SimpleNamespace(seq=seq, token_ids=list(tokens), start_pos=start,
                           num_scheduled_tokens=len(tokens), block_table=list(table),
                           do_sample=do_sample)


def test_prefill_inputs_layout_one_sequence():
    # 5 new tokens at positions 14..18 over a 14-token cached prefix, blocks of 8, 2 slots
    got = prefill_inputs([_row([11, 12, 13, 14, 15], 14, [7, 3, 9])], 8, 2, BLOCK)
    assert got.input_ids.tolist() == [11, 12, 13, 14, 15, 0, 0, 0]
    assert got.positions.tolist() == [14, 15, 16, 17, 18, 0, 0, 0]
    # position p -> table[p // 8] * 8 + p % 8; padding rows write nothing
    assert got.slot_mapping.tolist() == [3 * 8 + 6, 3 * 8 + 7, 9 * 8, 9 * 8 + 1, 9 * 8 + 2,
                                         -1, -1, -1]
    assert got.query_start_loc.tolist() == [0, 5, 8]
    assert got.seq_lens.tolist() == [19, 3]
    assert got.block_tables.tolist() == [[7, 3, 9], [0, 0, 0]]
    assert got.last_rows.tolist() == [4]
    assert got.query_start_loc.dtype == got.seq_lens.dtype == got.block_tables.dtype \
        == torch.int32
    assert got.last_rows.dtype == torch.int64
    full = prefill_inputs([_row(range(8), 0, [4])], 8, 2, BLOCK)  # n == T: an empty padding seq
    assert full.query_start_loc.tolist() == [0, 8, 8] and full.seq_lens.tolist() == [8, 0]


def test_prefill_inputs_layout_several_sequences():
    # a 3-token prompt, a decode row at position 9, over 5 slots: 2 real, 2 empty, padding
    rows = [_row([21, 22, 23], 0, [5]), _row([31], 9, [2, 6])]
    got = prefill_inputs(rows, 8, 5, BLOCK)
    assert got.input_ids.tolist() == [21, 22, 23, 31, 0, 0, 0, 0]
    assert got.positions.tolist() == [0, 1, 2, 9, 0, 0, 0, 0]
    assert got.slot_mapping.tolist() == [40, 41, 42, 6 * 8 + 1, -1, -1, -1, -1]
    assert got.query_start_loc.tolist() == [0, 3, 4, 4, 4, 8]  # empty slots: no queries
    assert got.seq_lens.tolist() == [3, 10, 0, 0, 4]
    assert got.block_tables.tolist() == [[5, 0], [2, 6], [0, 0], [0, 0], [0, 0]]
    assert got.last_rows.tolist() == [2, 3, 0, 0]
    # as many sequences as slots allow, no padding rows
    full = prefill_inputs([_row([1, 2], 0, [1]), _row([3, 4], 0, [2])], 4, 3, BLOCK)
    assert full.query_start_loc.tolist() == [0, 2, 4, 4] and full.seq_lens.tolist() == [2, 2, 0]
    assert full.last_rows.tolist() == [1, 3]


def test_prefill_inputs_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        prefill_inputs([_row(range(9), 0, [1, 2])], 8, 2, BLOCK)
    with pytest.raises(ValueError, match="does not fit"):
        prefill_inputs([_row([5], 3, [1])], 8, 2, BLOCK)
    with pytest.raises(ValueError, match="3 sequences do not fit 2 sequence slots"):
        prefill_inputs([_row([1, 2], 0, [1]), _row([3], 4, [2]), _row([5], 6, [3])], 8, 3,
                       BLOCK)
    with pytest.raises(ValueError, match="does not cover"):
        prefill_inputs([_row(range(4), 6, [1])], 8, 2, BLOCK)
    bad = _row([1, 2, 3], 0, [1])
    bad.token_ids = [1, 2]
    with pytest.raises(ValueError, match="2 token ids for 3"):
        prefill_inputs([bad], 8, 2, BLOCK)


def test_num_slots():
    assert num_slots(8, 256) == 9 and num_slots(512, 256) == 257 and num_slots(16, 4) == 5


def test_is_short_step():
    assert is_short_step([_row([1, 2], 0, [1])])
    assert is_short_step([_row(range(64), 900, [1])])
    assert is_short_step([_row(range(512), 0, [1])])
    assert not is_short_step([_row(range(513), 0, [1])])
    assert not is_short_step([_row([1], 5, [1])])  # one decode row: the decode graphs'
    assert not is_short_step([])
    assert is_short_step([_row([1, 2], 0, [1]), _row([3, 4], 0, [2])])  # two sequences
    assert is_short_step([_row([1], 7, [1]), _row([1], 9, [2]), _row(range(30), 0, [3])])
    assert not is_short_step([_row(range(300), 0, [1]), _row(range(213), 0, [2])])  # 513
    assert not is_short_step([_row([1, 2, 3], 0, [1], prompt_logprobs=1, num_prompt=3)])
    assert not is_short_step([_row([1], 5, [1]),  # one row wants prompt logprobs
                              _row([1, 2, 3], 0, [1], prompt_logprobs=1, num_prompt=3)])
    assert is_short_step([_row(range(20), 0, [1])], max_tokens=32)
    assert not is_short_step([_row(range(40), 0, [1])], max_tokens=32)
    three = [_row([1], 7, [1]), _row([1], 9, [2]), _row([2, 3], 0, [3])]
    assert is_short_step(three, max_seqs=3) and not is_short_step(three, max_seqs=2)


def test_prefill_sizes_stop_at_the_token_budget():
    assert PREFILL_SIZES == (8, 16, 32, 64, 128, 256, 512)
    assert prefill_sizes(8192) == prefill_sizes(512) == PREFILL_SIZES
    assert prefill_sizes(128) == (8, 16, 32, 64, 128)
    assert prefill_sizes(100) == (8, 16, 32, 64, 128)  # steps of 65..100 tokens pad to 128
    assert prefill_sizes(8) == prefill_sizes(3) == (8,)
