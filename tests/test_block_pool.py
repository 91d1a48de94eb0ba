"""BlockPool and SwapSpace: ref counts, LRU free queue, prefix-hash index, integrity checks."""

from __future__ import annotations

import random

import pytest

from edge_llm.config import CacheConfig, SchedulerConfig
from edge_llm.engine.block_pool import BlockPool, hash_block_tokens
from edge_llm.engine.scheduler import Scheduler
from edge_llm.engine.sequence import Sequence
from edge_llm.engine.swap_space import SwapSpace
from edge_llm.sampling_params import SamplingParams


def rand_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 32000) for _ in range(n)]


def computed_seq(pool: BlockPool, tokens: list[int]) -> Sequence:
    """A sequence whose every full block was 'computed' into freshly allocated blocks."""
    seq = Sequence("r", 0, tokens, SamplingParams(), max_output_tokens=1)
    num_full = len(tokens) // pool.block_size
    seq.block_table = pool.allocate(num_full)
    seq.num_computed_tokens = num_full * pool.block_size
    pool.cache_full_blocks(seq)
    return seq


def test_alloc_free_refcounts_and_usage(rng: random.Random) -> None:
    pool = BlockPool(10, 16, enable_prefix_caching=True)
    assert pool.num_free_blocks == 10 and pool.usage == 0.0
    a = pool.allocate(4)
    assert len(set(a)) == 4 and all(pool.ref_count(b) == 1 for b in a)
    assert pool.num_free_blocks == 6 and pool.usage == pytest.approx(0.4)
    pool.touch(a[:2])
    assert [pool.ref_count(b) for b in a] == [2, 2, 1, 1]
    pool.free(a)
    assert [pool.ref_count(b) for b in a] == [1, 1, 0, 0]
    assert pool.num_free_blocks == 8
    pool.check_integrity()
    # "does not fit" is a return value; allocating anyway is a caller bug
    assert pool.can_allocate(8) and not pool.can_allocate(9)
    with pytest.raises(RuntimeError, match="can_allocate"):
        pool.allocate(9)
    pool.free(a[:2])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([a[0]])
    pool.check_integrity()
    assert pool.num_free_blocks == 10
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0, 16, True)


def test_lru_eviction_order(rng: random.Random) -> None:
    bs = 8
    pool = BlockPool(6, bs, enable_prefix_caching=True)
    x = computed_seq(pool, rand_tokens(rng, 2 * bs))  # 2 hashed blocks
    y = computed_seq(pool, rand_tokens(rng, 2 * bs))  # 2 hashed blocks
    plain = pool.allocate(2)  # never hashed
    assert pool.num_free_blocks == 0 and pool.num_cached_blocks == 4
    pool.free(reversed(x.block_table))  # x's last block should be evicted before its first
    pool.free(plain)
    pool.free(reversed(y.block_table))
    pool.check_integrity()
    assert pool.num_free_blocks == 6
    # unhashed blocks are reused first, then cached blocks in the order they were freed
    expected = [plain[1], plain[0], x.block_table[1], x.block_table[0]]
    expected += [y.block_table[1], y.block_table[0]]
    got = [pool.allocate(1)[0] for _ in range(6)]
    assert got == expected
    assert pool.num_cached_blocks == 0  # every cached block was evicted on reuse
    pool.check_integrity()


def test_hit_revives_cached_block_out_of_free_queue(rng: random.Random) -> None:
    bs = 8
    pool = BlockPool(4, bs, enable_prefix_caching=True)
    tokens = rand_tokens(rng, 2 * bs + 3)
    x = computed_seq(pool, tokens)
    pool.free(reversed(x.block_table))
    assert pool.num_free_blocks == 4
    hits = pool.get_computed_blocks(tokens)
    assert hits == x.block_table and pool.num_evictable(hits) == 2
    pool.touch(hits)  # pulled out of the free queue, from its middle
    assert pool.num_free_blocks == 2 and all(pool.ref_count(b) == 1 for b in hits)
    fresh = pool.allocate(2)
    assert not set(fresh) & set(hits)
    pool.check_integrity()


def test_hashes_chain_on_parents(rng: random.Random) -> None:
    bs = 16
    pool = BlockPool(8, bs, enable_prefix_caching=True)
    a, b, c = (rand_tokens(rng, bs) for _ in range(3))
    x = computed_seq(pool, a + c)
    assert pool.get_computed_blocks(a + c) == x.block_table
    # block c under another parent: same tokens, different key, no hit at all
    assert pool.get_computed_blocks(b + c) == []
    assert pool.get_computed_blocks(c) == []
    assert hash_block_tokens(hash_block_tokens(None, a), c) != hash_block_tokens(
        hash_block_tokens(None, b), c
    )
    # a shared first block with a different second block hits the first one only
    assert pool.get_computed_blocks(a + b) == x.block_table[:1]
    # hashes are a function of the tokens: a caller's list is extended, never recomputed
    hashes: list[bytes] = []
    pool.get_computed_blocks(a + c + b, hashes)
    assert hashes[:2] == x.block_hashes and len(hashes) == 3
    assert pool.get_computed_blocks(a + c + b, hashes, max_blocks=1) == x.block_table[:1]


def test_duplicate_prefix_stays_unhashed_and_disabled_cache(rng: random.Random) -> None:
    bs = 8
    pool = BlockPool(8, bs, enable_prefix_caching=True)
    tokens = rand_tokens(rng, 2 * bs)
    x = computed_seq(pool, tokens)
    y = computed_seq(pool, tokens)  # computed concurrently: the index keeps x's blocks
    assert all(pool.block_hash(b) is None for b in y.block_table)
    assert pool.get_computed_blocks(tokens) == x.block_table
    pool.check_integrity()
    assert pool.reset_prefix_cache() == 0  # x's blocks are in use: nothing to drop
    pool.free(x.block_table)
    assert pool.reset_prefix_cache() == 2 and pool.get_computed_blocks(tokens) == []
    pool.check_integrity()
    off = BlockPool(8, bs, enable_prefix_caching=False)
    z = computed_seq(off, tokens)
    assert off.get_computed_blocks(tokens) == [] and off.num_cached_blocks == 0
    assert z.block_hashes == []  # nothing hashed when caching is off


def test_check_integrity_detects_corruption(rng: random.Random) -> None:
    pool = BlockPool(6, 8, enable_prefix_caching=True)
    x = computed_seq(pool, rand_tokens(rng, 16))
    pool.check_integrity()
    pool._ref[x.block_table[0]] = 0  # a used block that is not in the free queue
    with pytest.raises(AssertionError, match="missing from the free queue"):
        pool.check_integrity()
    pool._ref[x.block_table[0]] = 1
    pool._hash[x.block_table[1]] = None  # index entry without its block hash
    with pytest.raises(AssertionError, match="index"):
        pool.check_integrity()


def test_swap_space() -> None:
    swap = SwapSpace(5)
    assert swap.num_free == 5 and swap.can_swap_out(5) and not swap.can_swap_out(6)
    a = swap.allocate(3)
    assert len(set(a)) == 3 and swap.num_free == 2 and swap.usage == pytest.approx(0.6)
    with pytest.raises(RuntimeError, match="can_swap_out"):
        swap.allocate(3)
    swap.free(a[:1])
    with pytest.raises(RuntimeError, match="not in use"):
        swap.free(a[:1])
    swap.check_integrity()
    swap._used.add(a[0])  # corrupt: a slot both free and used
    with pytest.raises(AssertionError, match="both free and used"):
        swap.check_integrity()
    assert SwapSpace(0).usage == 0.0 and not SwapSpace(0).can_swap_out(1)


def _prefill_all(sched: Scheduler) -> None:
    while any(s.num_tokens - s.num_computed_tokens > 1 for s in sched.running) or sched.waiting:
        out = sched.schedule()
        sched.update_from_output(out, {r.seq.seq_id: 5 for r in out.scheduled if r.do_sample})
        sched.check_integrity()


@pytest.mark.parametrize("first_finished", [False, True])
def test_prefix_hit_1000_token_prompt(rng: random.Random, first_finished: bool) -> None:
    # block 16: a 1,000-token prefix has 62 full blocks (992 tokens); the 63rd is partial
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512, max_model_len=2048),
        CacheConfig(block_size=16),
        num_gpu_blocks=300,
        num_cpu_blocks=0,
    )
    prefix = rand_tokens(rng, 1000)
    (first,) = sched.add_request("a", prefix, SamplingParams(max_tokens=3))
    _prefill_all(sched)
    assert first.num_cached_tokens == 0
    if first_finished:
        sched.abort("a")  # its hashed blocks stay cached in the free queue
        assert sched.pool.num_free_blocks == 300
    (same,) = sched.add_request("b", prefix, SamplingParams(max_tokens=3))
    (longer,) = sched.add_request("c", prefix + rand_tokens(rng, 40), SamplingParams())
    out = sched.schedule()
    rows = {r.seq.request_id: r for r in out.scheduled}
    assert same.num_cached_tokens == 992 and longer.num_cached_tokens == 992
    # the identical prompt still computes its last 8 tokens; the longer one its last 48
    assert (rows["b"].start_pos, rows["b"].num_scheduled_tokens) == (992, 8)
    assert (rows["c"].start_pos, rows["c"].num_scheduled_tokens) == (992, 48)
    assert same.block_table[:62] == longer.block_table[:62]
    assert all(sched.pool.ref_count(b) == 3 - first_finished for b in same.block_table[:62])
    assert sched.pool.prefix_queries == 1000 + 1000 + 1040
    assert sched.pool.prefix_hits == 992 * 2
    sched.update_from_output(out, {r.seq.seq_id: 9 for r in out.scheduled if r.do_sample})
    sched.check_integrity()


def test_prompt_of_exact_blocks_computes_one_block(rng: random.Random) -> None:
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=256),
        CacheConfig(block_size=16),
        num_gpu_blocks=40,
        num_cpu_blocks=0,
    )
    prompt = rand_tokens(rng, 64)  # exactly 4 blocks
    sched.add_request("a", prompt, SamplingParams(max_tokens=2))
    _prefill_all(sched)
    (again,) = sched.add_request("b", prompt, SamplingParams(max_tokens=2))
    out = sched.schedule()
    row = next(r for r in out.scheduled if r.seq is again)
    # never the whole prompt from the cache: the last block is recomputed to sample from it
    assert again.num_cached_tokens == 48 and (row.start_pos, row.num_scheduled_tokens) == (48, 16)
    assert row.do_sample
