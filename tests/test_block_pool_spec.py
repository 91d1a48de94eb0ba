"""BlockPool contracts the older tests leave open: a prefix hit is contiguous from block 0, only
full blocks are hashed or looked up, size checks, and what ``check_integrity`` reports."""

from __future__ import annotations

import random

import pytest

from edge_llm.engine.block_pool import BlockPool, hash_block_tokens
from edge_llm.engine.sequence import Sequence
from edge_llm.sampling_params import SamplingParams

BS = 4


def cached_prefix(pool: BlockPool, tokens: list[int]) -> list[int]:
    """Compute ``tokens``'s full blocks into fresh blocks, register and free them: they stay
    cached. Returns the block ids, in block order."""
    seq = Sequence("r", 0, tokens, SamplingParams(), max_output_tokens=1)
    num_full = len(tokens) // pool.block_size
    seq.block_table = pool.allocate(num_full)
    seq.num_computed_tokens = num_full * pool.block_size
    pool.cache_full_blocks(seq)
    pool.free(reversed(seq.block_table))
    return list(seq.block_table)


def evict(pool: BlockPool, block: int) -> None:
    """Evict exactly ``block`` (a cached block): take every other free block out of the queue
    while the allocation takes it, then give them back."""
    others = [b for b in range(pool.num_blocks) if b != block and pool.ref_count(b) == 0]
    pool.touch(others)
    (got,) = pool.allocate(1)
    assert got == block and pool.block_hash(block) is None
    pool.free([got])
    pool.free(reversed(others))


def test_hit_stops_at_the_first_missing_block(rng: random.Random) -> None:
    """Block i's key covers the whole prefix, but the KV of block i-1 must be there too: a hit
    is the longest run of cached blocks starting at block 0, never one after a gap."""
    pool = BlockPool(8, BS, enable_prefix_caching=True)
    tokens = [rng.randrange(1, 1000) for _ in range(4 * BS)]
    blocks = cached_prefix(pool, tokens)
    assert pool.get_computed_blocks(tokens) == blocks
    evict(pool, blocks[1])  # blocks 0, 2 and 3 still cached, block 1 gone
    assert pool.num_cached_blocks == 3
    assert pool.get_computed_blocks(tokens) == blocks[:1]
    evict(pool, blocks[0])
    assert pool.get_computed_blocks(tokens) == []
    pool.check_integrity()


def test_only_full_blocks_are_hashed_or_looked_up(rng: random.Random) -> None:
    pool = BlockPool(8, BS, enable_prefix_caching=True)
    tokens = [rng.randrange(1, 1000) for _ in range(3 * BS)]
    blocks = cached_prefix(pool, tokens)
    partial = tokens[: 2 * BS + BS - 1]  # two full blocks and a partial one
    hashes: list[bytes] = []
    assert pool.get_computed_blocks(partial, hashes) == blocks[:2]
    assert len(hashes) == 2  # the partial block got no key
    assert hashes[1] == hash_block_tokens(hashes[0], tokens[BS : 2 * BS])
    # max_blocks caps the hit; a larger cap does not reach past the full blocks
    hashes = []
    assert pool.get_computed_blocks(tokens, hashes, max_blocks=1) == blocks[:1]
    assert len(hashes) == 1
    assert pool.get_computed_blocks(partial, None, max_blocks=5) == blocks[:2]
    assert pool.get_computed_blocks(tokens, None, max_blocks=0) == []
    # a sequence one token short of a block hashes nothing at all
    hashes = []
    assert pool.get_computed_blocks(tokens[: BS - 1], hashes) == [] and hashes == []


def test_known_hashes_are_reused_not_recomputed(rng: random.Random) -> None:
    pool = BlockPool(8, BS, enable_prefix_caching=True)
    tokens = [rng.randrange(1, 1000) for _ in range(2 * BS)]
    blocks = cached_prefix(pool, tokens)
    h0 = hash_block_tokens(None, tokens[:BS])
    hashes = [h0]
    assert pool.get_computed_blocks(tokens, hashes) == blocks
    assert hashes == [h0, hash_block_tokens(h0, tokens[BS:])]
    # the caller's key for block 0 is what the lookup uses (it does not re-hash block 0)
    assert pool.get_computed_blocks(tokens, [b"\x00" * 32]) == []


def test_caching_off_looks_nothing_up() -> None:
    pool = BlockPool(4, BS, enable_prefix_caching=False)
    seq = Sequence("r", 0, list(range(1, 2 * BS + 1)), SamplingParams(), max_output_tokens=1)
    seq.block_table = pool.allocate(2)
    seq.num_computed_tokens = 2 * BS
    pool.cache_full_blocks(seq)
    assert pool.num_cached_blocks == 0 and seq.block_hashes == []
    assert pool.get_computed_blocks(seq.all_token_ids) == []


def test_registering_a_block_once_full() -> None:
    """cache_full_blocks registers exactly the blocks completed since the last call."""
    pool = BlockPool(4, BS, enable_prefix_caching=True)
    tokens = list(range(1, 3 * BS + 1))
    seq = Sequence("r", 0, tokens, SamplingParams(), max_output_tokens=1)
    seq.block_table = pool.allocate(3)
    seq.num_computed_tokens = BS - 1
    pool.cache_full_blocks(seq)
    assert pool.num_cached_blocks == 0 and seq.num_registered_blocks == 0
    seq.num_computed_tokens = BS + 1
    pool.cache_full_blocks(seq)
    assert pool.num_cached_blocks == 1 and seq.num_registered_blocks == 1
    seq.num_computed_tokens = 3 * BS
    pool.cache_full_blocks(seq)
    assert seq.num_registered_blocks == 3
    assert [pool.block_hash(b) for b in seq.block_table] == seq.block_hashes
    pool.check_integrity()


@pytest.mark.parametrize("num_blocks, block_size", [(1, 1), (1, 16), (3, 1)])
def test_smallest_pools_are_valid(num_blocks: int, block_size: int) -> None:
    pool = BlockPool(num_blocks, block_size, enable_prefix_caching=True)
    assert pool.num_free_blocks == num_blocks and pool.block_size == block_size
    assert pool.allocate(num_blocks) == list(range(num_blocks))


@pytest.mark.parametrize(
    "num_blocks, block_size, message",
    [(0, 4, "num_blocks must be >= 1, got 0"), (-2, 4, "num_blocks must be >= 1, got -2"),
     (4, 0, "block_size must be >= 1, got 0")],
)
def test_bad_sizes_are_refused_with_the_value(num_blocks: int, block_size: int,
                                              message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BlockPool(num_blocks, block_size, enable_prefix_caching=True)


def test_allocate_past_the_free_blocks_names_the_fix() -> None:
    pool = BlockPool(2, BS, enable_prefix_caching=True)
    with pytest.raises(RuntimeError, match=r"allocate\(3\) with only 2 free blocks: "
                                           r"call can_allocate first\."):
        pool.allocate(3)


# ---- check_integrity: a healthy pool passes, each broken invariant is named ----------------


def healthy_pool(rng: random.Random) -> BlockPool:
    """Used, cached and plain free blocks at once."""
    pool = BlockPool(16, BS, enable_prefix_caching=True)
    cached_prefix(pool, [rng.randrange(1, 1000) for _ in range(3 * BS)])
    pool.allocate(2)
    pool.check_integrity()
    assert pool.num_cached_blocks == 3 and 0 < pool.num_free_blocks < 16
    return pool


def broken(pool: BlockPool) -> str:
    with pytest.raises(AssertionError) as info:
        pool.check_integrity()
    message = str(info.value)
    assert message.startswith("BlockPool integrity: ")
    return message


def test_integrity_unknown_id_in_free_queue(rng: random.Random) -> None:
    pool = healthy_pool(rng)
    b = next(iter(pool._free))
    del pool._free[b]
    pool._free[pool.num_blocks] = None  # one past the last id, queue not longer than the pool
    assert broken(pool) == f"BlockPool integrity: free queue holds unknown block ids: " \
                           f"[{pool.num_blocks}]"
    pool._free[-1] = None
    assert broken(pool).endswith(f"unknown block ids: [{pool.num_blocks}, -1]")


def test_integrity_negative_refs_lists_ten(rng: random.Random) -> None:
    pool = BlockPool(16, BS, enable_prefix_caching=True)
    for b in range(12):
        del pool._free[b]
        pool._ref[b] = -1
    message = broken(pool)
    assert "negative ref counts on blocks [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]" in message


def test_integrity_busy_block_in_free_queue(rng: random.Random) -> None:
    pool = BlockPool(16, BS, enable_prefix_caching=True)
    for b in range(12):
        pool._ref[b] = 1  # referenced, yet still queued as free
    message = broken(pool)
    assert "blocks in the free queue with ref > 0: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]" in message
    assert "free 16 + cached 0 + used 12 != total 16" in message


def test_integrity_lost_blocks(rng: random.Random) -> None:
    pool = BlockPool(16, BS, enable_prefix_caching=True)
    for b in range(12):
        del pool._free[b]
    message = broken(pool)
    assert "blocks with ref 0 missing from the free queue: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]" \
        in message
    # the count check fails too: every broken invariant is listed, not just the first
    assert message == ("BlockPool integrity: free 4 + cached 0 + used 0 != total 16; "
                       "blocks with ref 0 missing from the free queue: "
                       "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]")


def test_integrity_counts_cached_blocks_once(rng: random.Random) -> None:
    pool = healthy_pool(rng)  # 2 used, 3 cached, 11 plain free
    b = next(b for b in pool._free if pool._hash[b] is None)
    del pool._free[b]  # lost: ref 0 but not queued
    assert "free 10 + cached 3 + used 2 != total 16" in broken(pool)


def test_integrity_lists_ten_unknown_ids(rng: random.Random) -> None:
    pool = BlockPool(4, BS, enable_prefix_caching=True)
    for b in range(100, 112):
        pool._free[b] = None
    assert broken(pool).endswith(f"unknown block ids: {list(range(100, 110))}")


def test_integrity_index_mismatches(rng: random.Random) -> None:
    pool = healthy_pool(rng)
    key = next(iter(pool._index))
    b = pool._index[key]
    pool._hash[b] = b"\x01" * 32
    assert "index maps a key to block" in broken(pool)
    pool = healthy_pool(rng)
    plain = next(b for b in pool._free if pool._hash[b] is None)
    pool._hash[plain] = b"\x02" * 32
    assert "4 hashed blocks but 3 index entries" in broken(pool)
