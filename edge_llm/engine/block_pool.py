"""GPU KV blocks: reference counts, a free queue in LRU order, and the prefix-cache index.

Every block is in exactly one of three states::

    used     ref_count > 0                  held by one or more sequences' block tables
    cached   ref_count == 0, has a hash     in the free queue; a prefix hit pulls it back out
    free     ref_count == 0, no hash        in the free queue

The free queue is an ``OrderedDict`` used as a doubly-linked list (O(1) removal from the
middle when a prefix hit revives a cached block)::

    head (allocated next) -> [ free, ... free | cached (least recently freed) ... cached ] <- tail

``allocate`` takes blocks from the head; a cached block taken this way is evicted (its hash
leaves the index). ``free`` puts a block whose ref count drops to 0 at the tail if it holds a
hash (so the least recently used cached block is evicted first) and at the head if it holds
none (it has nothing to offer a later request, so it is reused before any cached block).

Prefix-cache keys: the key of full block ``i`` is ``sha256(key[i-1] || tokens of block i as
int64)``, with an empty parent for block 0, so a key identifies the whole prefix up to the end
of its block. Collisions are handled by strength: the 256-bit digest makes a false hit
negligible (~2^-128 for 2^64 blocks), so tokens are not stored or compared.

"Does not fit" is a return value (``can_allocate`` / ``get_computed_blocks``), never an
exception; calling ``allocate`` without room is a caller bug and raises ``RuntimeError``.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable
from collections.abc import Sequence as SeqOf
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sequence import Sequence

_ROOT = b""


def hash_block_tokens(parent: bytes | None, token_ids: SeqOf[int]) -> bytes:
    """The prefix-cache key of a full block: sha256 over the parent key and its token ids."""
    h = hashlib.sha256(parent or _ROOT)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class BlockPool:
    """Reference-counted KV blocks with an LRU prefix cache (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}.")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}.")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks
        self._index: dict[bytes, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # prefix-cache metrics, in tokens (recorded by the scheduler once per admission)
        self.prefix_queries = 0
        self.prefix_hits = 0

    # ---- counts ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an ``allocate`` can take now (free and cached)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks in the index (used or cached)."""
        return len(self._index)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences (cached blocks count as free), in [0, 1]."""
        return 1.0 - len(self._free) / self.num_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def block_hash(self, block_id: int) -> bytes | None:
        return self._hash[block_id]

    def num_evictable(self, block_ids: Iterable[int]) -> int:
        """How many of ``block_ids`` sit in the free queue (a ``touch`` would take them out)."""
        ref = self._ref
        return sum(1 for b in block_ids if ref[b] == 0)

    # ---- allocation -----------------------------------------------------------------------
    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` from the free-queue head (evicting cached ones), ref count 1."""
        if num_blocks > len(self._free):
            raise RuntimeError(
                f"allocate({num_blocks}) with only {len(self._free)} free blocks: "
                "call can_allocate first."
            )
        out = []
        free, ref, hashes = self._free, self._ref, self._hash
        for _ in range(num_blocks):
            b, _ = free.popitem(last=False)
            key = hashes[b]
            if key is not None:  # evict: the block's content is about to be overwritten
                del self._index[key]
                hashes[b] = None
            ref[b] = 1
            out.append(b)
        return out

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take a reference on each block (a prefix hit or a fork); revives cached blocks."""
        ref, free = self._ref, self._free
        for b in block_ids:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop a reference on each block; at 0 it joins the free queue, keeping its hash.

        Blocks reaching 0 are queued in the given order, so pass a block table reversed: a
        prefix's last blocks are then evicted before its first ones.
        """
        ref, free, hashes = self._ref, self._free, self._hash
        for b in block_ids:
            r = ref[b] - 1
            if r < 0:
                raise RuntimeError(f"free of block {b}, which is not in use (double free).")
            ref[b] = r
            if r == 0:
                free[b] = None
                if hashes[b] is None:
                    free.move_to_end(b, last=False)

    # ---- prefix cache ---------------------------------------------------------------------
    def get_computed_blocks(
        self,
        token_ids: SeqOf[int],
        block_hashes: list[bytes] | None = None,
        max_blocks: int | None = None,
    ) -> list[int]:
        """Blocks holding the longest cached prefix of ``token_ids``'s full blocks.

        ``block_hashes``, when given, must hold the keys of ``token_ids``'s leading full
        blocks (possibly none); keys computed here are appended to it, so a sequence never
        hashes a block twice. At most ``max_blocks`` blocks are returned. Pure lookup: no ref
        counts change (``touch`` the result to take it) and no metrics are recorded.
        """
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        limit = len(token_ids) // bs
        if max_blocks is not None:
            limit = min(limit, max_blocks)
        hashes = [] if block_hashes is None else block_hashes
        out: list[int] = []
        index = self._index
        for i in range(limit):
            if i == len(hashes):
                parent = hashes[i - 1] if i else None
                hashes.append(hash_block_tokens(parent, token_ids[i * bs : (i + 1) * bs]))
            b = index.get(hashes[i])
            if b is None:
                break
            out.append(b)
        return out

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Offer ``seq``'s newly computed full blocks to the index.

        Looks only at blocks ``[seq.num_registered_blocks, num_computed_tokens // block_size)``
        and hashes only blocks beyond ``len(seq.block_hashes)``: O(new blocks) per call. A
        block whose key is already indexed (another sequence computed the same prefix) stays
        unhashed; the indexed copy keeps serving hits.
        """
        bs = self.block_size
        num_full = seq.num_computed_tokens // bs
        i = seq.num_registered_blocks
        if i >= num_full or not self.enable_prefix_caching:
            return
        hashes, table, tokens = seq.block_hashes, seq.block_table, seq.all_token_ids
        index, block_hash = self._index, self._hash
        while i < num_full:
            if i == len(hashes):
                parent = hashes[i - 1] if i else None
                hashes.append(hash_block_tokens(parent, tokens[i * bs : (i + 1) * bs]))
            key, b = hashes[i], table[i]
            if block_hash[b] is None and key not in index:
                block_hash[b] = key
                index[key] = b
            i += 1
        seq.num_registered_blocks = num_full

    def record_prefix_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_queries += num_query_tokens
        self.prefix_hits += num_hit_tokens

    def reset_prefix_cache(self) -> int:
        """Drop the hashes of all cached (unreferenced) blocks; returns how many."""
        dropped = 0
        for b in self._free:
            key = self._hash[b]
            if key is not None:
                del self._index[key]
                self._hash[b] = None
                dropped += 1
        return dropped

    # ---- checks ---------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken invariant (see the module docstring)."""
        errors: list[str] = []
        ref, hashes, free = self._ref, self._hash, self._free
        unknown = [b for b in free if not 0 <= b < self.num_blocks]
        if unknown:  # the checks below index by block id: report this one alone
            raise AssertionError(f"BlockPool integrity: free queue holds unknown block ids: "
                                 f"{unknown[:10]}")
        negative = [b for b in range(self.num_blocks) if ref[b] < 0]
        if negative:
            errors.append(f"negative ref counts on blocks {negative[:10]}")
        used = sum(1 for r in ref if r > 0)
        cached = sum(1 for b in free if hashes[b] is not None)
        plain = len(free) - cached
        if plain + cached + used != self.num_blocks:
            errors.append(
                f"free {plain} + cached {cached} + used {used} != total {self.num_blocks}"
            )
        busy_free = [b for b in free if ref[b] != 0]
        if busy_free:
            errors.append(f"blocks in the free queue with ref > 0: {busy_free[:10]}")
        lost = [b for b in range(self.num_blocks) if ref[b] == 0 and b not in free]
        if lost:
            errors.append(f"blocks with ref 0 missing from the free queue: {lost[:10]}")
        for key, b in self._index.items():
            if hashes[b] != key:
                errors.append(f"index maps a key to block {b}, which holds another hash")
                break
        num_hashed = sum(1 for h in hashes if h is not None)
        if num_hashed != len(self._index):
            errors.append(f"{num_hashed} hashed blocks but {len(self._index)} index entries")
        if errors:
            raise AssertionError("BlockPool integrity: " + "; ".join(errors))
