"""CUDA graphs for short steps that prefill: up to 512 new tokens in all, one sequence or several,
decode rows alongside (a chat prompt, a prompt's last chunk, the uncached tail after a
prefix-cache hit, a new request joining running ones). Off with ``--enforce-eager``, as every
graph is.

An eager forward of a 7B model costs tens of ms of Python launch overhead whatever its length, so
the few new tokens after a long cached prefix took as long as the whole prompt, and a new 256-token
prompt joining decoding sequences stalled every stream's next token for tens of ms; a graph replay
of the same forward costs a few ms. Eligible steps (``is_short_step``): ``2 <= N <= 512`` new tokens
over at most ``max_seqs`` sequences, none wanting prompt logprobs (one-token decode-only steps take
the decode graphs first).
``N`` is padded up to the smallest bucket ``T`` in ``PREFILL_SIZES`` (8, 16, ..., 512;
``prefill_sizes`` drops the buckets a step of ``max_num_batched_tokens`` cannot reach); one
graph per bucket, over ``K = min(T, max_seqs) + 1`` sequence slots.

Layout: S real sequences in slots 0 .. S-1 (scheduled order), empty slots, and the padding
sequence in slot K-1::

    rows               input_ids  positions   slot_mapping   attention sequence
    qsl[i] <= r        its tokens start_i + j its cache      slot i < S: seq_len start_i + n_i,
      < qsl[i+1]                              slots          its block table
    (no rows)                                                slot S <= i < K-1: empty, num_q 0,
                                                             seq_len 0 (owns no q tile)
    N <= r < T         0          0           -1 (write_kv   slot K-1: seq_len T - N,
                                               skips it)     table of zeros (block 0: read,
                                                             never written)
    query_start_loc (K + 1, on the device) = [0, n_0, n_0 + n_1, ..., N, ..., N, T]

    forward(T rows) -> rows last_rows[i] = qsl[i+1] - 1 (0 for empty slots) -> compute_logits
    -> logits[:K-1] (fp32): row i is slot i's last row, the one the sampler reads

The logits buffer is the decode graphs' (max_batch, vocab) one when the runner passes it
(a separate (256, vocab) fp32 buffer would be 155 MB with Qwen2.5's vocabulary); a graph's
temporaries of those rows reuse the pool blocks of the decode graphs captured before it.

Positions feed only the rotary embedding (the kernel places queries by ``seq_len``): padding
rows take 0, in range of the rotary table whatever ``max_model_len``.

Why the padding is a sequence of its own and not the tail of the last real one: the prefill
kernel loads keys up to the last position of a query tile, so the real rows of a tile that also
holds padding rows would load the unwritten slots past the sequence (``torch.empty`` memory,
possibly NaN). Their softmax weight is 0, but ``0 * NaN`` is NaN in ``p @ V``. With the padding
in its own slot, every real sequence's attention is exactly the eager step's (same ``seq_len``,
``num_q`` and tiles), and the norms and linears are row-independent, so the real rows get the
eager rows' values up to the linears' row-count-dependent rounding: the K/V they write and the
sampled rows' logits (tests/test_prefill_graphs.py).

Graph safety: the prefill kernel (kernels/paged_prefill.py) takes ``query_start_loc`` on the
device, computes its tiles there, and sizes its grid from ``T`` and the slot count ``K`` only
(the programs past the real tiles exit); ``max_query_len = T`` picks it without a host read
(decode rows in the step go through it too, as in an eager mixed step); ``max_seq_len`` (the
host int that plans the prefill kernel's key split and the decode kernel's context split) is
``max_model_len``, so a graph's launches are fixed. W4A16 linears take the path of their padded
row count (above 64 rows on mma.sync and 128 on wgmma, dequantize + cuBLAS into the one reused
buffer). CPU never captures: ``PrefillGraphs.run`` without a captured graph runs the same padded
forward eagerly (the CPU tests' path). Graphs are captured at start-up after the decode graphs,
into their pool; dropped on sleep; after a wake captured on first use.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from edge_llm.model.attention_metadata import AttentionMetadata

from .cuda_graphs import (
    GraphStats,
    capture_stats,
    padded_size,
    release_graphs,
    wants_prompt_logprobs,
)
from .graph_capture import capture_graph
from .scheduler_output import ScheduledSeq

PREFILL_SIZES = (8, 16, 32, 64, 128, 256, 512)  # padded new-token counts, one graph each
MIN_TOKENS = 2  # one-token steps are decode steps (cuda_graphs.py)


def prefill_sizes(max_num_batched_tokens: int) -> tuple[int, ...]:
    """The buckets a step of at most ``max_num_batched_tokens`` tokens can use: those below it
    and the first at or above it."""
    below = tuple(t for t in PREFILL_SIZES if t < max_num_batched_tokens)
    above = [t for t in PREFILL_SIZES if t >= max_num_batched_tokens][:1]
    return below + tuple(above)


def is_short_step(scheduled: list[ScheduledSeq], max_tokens: int = PREFILL_SIZES[-1],
                  max_seqs: int = PREFILL_SIZES[-1]) -> bool:
    """``MIN_TOKENS .. max_tokens`` new tokens in all over at most ``max_seqs`` sequences,
    none wanting prompt logprobs."""
    if not scheduled or len(scheduled) > max_seqs:
        return False
    n = sum(s.num_scheduled_tokens for s in scheduled)
    return MIN_TOKENS <= n <= max_tokens and not any(map(wants_prompt_logprobs, scheduled))


def num_slots(t: int, max_seqs: int) -> int:
    """Sequence slots of the bucket of ``t`` rows: a step of ``t`` tokens holds at most ``t``
    sequences (and at most ``max_seqs``), plus the padding sequence."""
    return min(t, max_seqs) + 1


@dataclass
class PrefillInputs:
    """One short step's inputs on the host, padded to ``T`` rows and ``K`` slots (module doc)."""

    input_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64
    slot_mapping: torch.Tensor  # (T,) int64, -1 on padding rows
    query_start_loc: torch.Tensor  # (K + 1,) int32: [0, n_0, ..., N, ..., N, T]
    seq_lens: torch.Tensor  # (K,) int32: start_i + n_i, 0 for empty slots, T - N
    block_tables: torch.Tensor  # (K, W) int32, W = the longest table; zeros past each table
    last_rows: torch.Tensor  # (K - 1,) int64: each slot's last row, 0 for empty slots


def prefill_inputs(scheduled: list[ScheduledSeq], t: int, slots: int,
                   block_size: int) -> PrefillInputs:
    """Lay out the ``ScheduledSeq`` rows of a short step as ``t`` rows over ``slots`` sequence
    slots (module doc)."""
    n_total = sum(s.num_scheduled_tokens for s in scheduled)
    if not MIN_TOKENS <= n_total <= t:
        raise ValueError(f"a short step of {n_total} tokens does not fit {t} padded rows.")
    if len(scheduled) > slots - 1:
        raise ValueError(f"{len(scheduled)} sequences do not fit {slots - 1} sequence slots.")
    ids: list[int] = []
    positions: list[int] = []
    slot_ids: list[int] = []
    qsl, seq_lens, last = [0], [], []
    width = max(len(s.block_table) for s in scheduled)
    tables = np.zeros((slots, width), dtype=np.int32)
    for i, s in enumerate(scheduled):
        n, start, table = s.num_scheduled_tokens, s.start_pos, s.block_table
        if len(s.token_ids) != n:
            raise ValueError(f"{len(s.token_ids)} token ids for {n} scheduled tokens.")
        if len(table) * block_size < start + n:
            raise ValueError(f"a table of {len(table)} blocks does not cover position "
                             f"{start + n - 1}.")
        ids.extend(s.token_ids)
        positions.extend(range(start, start + n))
        slot_ids.extend(table[p // block_size] * block_size + p % block_size
                        for p in range(start, start + n))
        qsl.append(qsl[-1] + n)
        seq_lens.append(start + n)
        last.append(qsl[-1] - 1)
        tables[i, : len(table)] = table
    empty = slots - 1 - len(scheduled)
    pad = t - n_total
    return PrefillInputs(
        input_ids=torch.tensor(ids + [0] * pad, dtype=torch.int64),
        positions=torch.tensor(positions + [0] * pad, dtype=torch.int64),
        slot_mapping=torch.tensor(slot_ids + [-1] * pad, dtype=torch.int64),
        query_start_loc=torch.tensor(qsl + [n_total] * empty + [t], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens + [0] * empty + [pad], dtype=torch.int32),
        block_tables=torch.from_numpy(tables),
        last_rows=torch.tensor(last + [0] * empty, dtype=torch.int64),
    )


class PrefillGraphs:
    """Static buffers for ``max(sizes)`` rows and ``num_slots(max(sizes), max_seqs)`` sequence
    slots, and one graph per size over them.

    ``run(scheduled)`` (``can_run`` true) fills the buffers and replays the graph of the padded
    size, or without one (CPU; not captured) runs the same padded forward eagerly; it returns
    the logits of each sequence's last row. ``logits``: a (rows >= max_seqs, vocab) fp32
    buffer to write them into (the decode graphs'), or None for one of this object's own;
    ``max_seqs`` is capped at its rows. ``release()`` drops the graphs (before the KV cache or
    the weights move). ``replays`` counts steps per padded size.
    """

    def __init__(self, model, kv_layers: list, max_model_len: int, block_size: int,
                 device: torch.device, sizes: tuple[int, ...] = PREFILL_SIZES,
                 max_seqs: int | None = None, logits: torch.Tensor | None = None) -> None:
        sizes = list(sizes)
        if not sizes or sorted(set(sizes)) != sizes or sizes[0] < MIN_TOKENS:
            raise ValueError(f"sizes must be ascending distinct ints >= {MIN_TOKENS}, "
                             f"got {sizes}.")
        if max_seqs is not None and max_seqs < 1:
            raise ValueError(f"max_seqs must be >= 1, got {max_seqs}.")
        self.model = model
        self.kv_layers = kv_layers
        self.sizes = sizes
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.device = device
        self.max_blocks = -(-max_model_len // block_size)
        rows, vocab = sizes[-1], model.arch.vocab_size
        self.max_seqs = min(max_seqs or rows, rows)
        if logits is not None:
            self.max_seqs = min(self.max_seqs, logits.shape[0])
        slots = num_slots(rows, self.max_seqs)
        # the padding sequence (up to rows - 2 tokens) reads its row up to its own length
        width = max(self.max_blocks, -(-rows // block_size))
        with torch.inference_mode():
            self.input_ids = torch.zeros(rows, dtype=torch.int64, device=device)
            self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
            self.slot_mapping = torch.full((rows,), -1, dtype=torch.int64, device=device)
            self.query_start_loc = torch.zeros(slots + 1, dtype=torch.int32, device=device)
            self.seq_lens = torch.zeros(slots, dtype=torch.int32, device=device)
            self.block_tables = torch.zeros((slots, width), dtype=torch.int32, device=device)
            self.last_rows = torch.zeros(slots - 1, dtype=torch.int64, device=device)
            self._own_logits = logits is None
            self.logits = (torch.empty((self.max_seqs, vocab), dtype=torch.float32,
                                       device=device) if logits is None else logits)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._lazy: set[int] = set()
        self._pool = None
        self.replays: Counter[int] = Counter()

    def can_run(self, scheduled: list[ScheduledSeq]) -> bool:
        return (is_short_step(scheduled, self.sizes[-1], self.max_seqs)
                and max(len(s.block_table) for s in scheduled) <= self.max_blocks)

    def _forward(self, t: int) -> None:
        """The captured body: forward of static rows [0, t) over the bucket's slots, logits
        of each slot's last row (``last_rows``) into logits[:K-1]."""
        k = num_slots(t, self.max_seqs)
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:t],
            query_start_loc=self.query_start_loc[: k + 1],
            seq_lens=self.seq_lens[:k],
            block_tables=self.block_tables[:k],
            max_query_len=t,
            max_seq_len=self.max_model_len,
        )
        hidden = self.model(self.input_ids[:t], self.positions[:t], self.kv_layers, meta)
        rows = hidden.index_select(0, self.last_rows[: k - 1])
        self.logits[: k - 1].copy_(self.model.compute_logits(rows))

    @torch.inference_mode()
    def run(self, scheduled: list[ScheduledSeq]) -> torch.Tensor:
        """Logits (S, vocab) fp32 of a short step (``can_run``), row i: the last row of
        ``scheduled[i]``; a view of the logits buffer, valid until the next ``run`` (of these
        graphs or of the decode graphs sharing it)."""
        if not self.can_run(scheduled):
            raise ValueError("not a short step that fits the buffers.")
        t = padded_size(self.sizes, sum(s.num_scheduled_tokens for s in scheduled))
        k = num_slots(t, self.max_seqs)
        if t in self._lazy:  # first use after a wake: capture before the inputs go in
            self._capture_one(t, self._pool if self._pool is not None
                              else torch.cuda.graph_pool_handle())
            self._lazy.discard(t)
        self.load(prefill_inputs(scheduled, t, k, self.block_size))
        graph = self.graphs.get(t)
        if graph is not None:
            graph.replay()
        else:
            self._forward(t)
        self.replays[t] += 1
        return self.logits[: len(scheduled)]

    def load(self, host: PrefillInputs) -> None:
        """Copy a step's padded inputs (``prefill_inputs``) into the static buffers."""
        t, k = host.input_ids.shape[0], host.seq_lens.shape[0]
        w = host.block_tables.shape[1]
        self.input_ids[:t].copy_(host.input_ids, non_blocking=True)
        self.positions[:t].copy_(host.positions, non_blocking=True)
        self.slot_mapping[:t].copy_(host.slot_mapping, non_blocking=True)
        self.query_start_loc[: k + 1].copy_(host.query_start_loc, non_blocking=True)
        self.seq_lens[:k].copy_(host.seq_lens, non_blocking=True)
        self.block_tables[:k, :w].copy_(host.block_tables, non_blocking=True)
        self.block_tables[k - 1, w:].zero_()  # the padding sequence's row, past w as well
        self.last_rows[: k - 1].copy_(host.last_rows, non_blocking=True)

    def _pad_all(self, t: int) -> None:
        """Every row padding (no real queries, nothing written): warm-up and capture runs."""
        k = num_slots(t, self.max_seqs)
        self.input_ids.zero_()
        self.positions.zero_()
        self.slot_mapping.fill_(-1)
        self.query_start_loc.zero_()
        self.query_start_loc[k:].fill_(t)
        self.seq_lens.zero_()
        self.seq_lens[k - 1] = t
        self.block_tables.zero_()
        self.last_rows.zero_()

    def _capture_one(self, t: int, pool) -> torch.cuda.CUDAGraph:
        """Warm size ``t`` up eagerly, then capture it into ``pool`` (inputs all padding)."""
        self._pool = pool
        self._pad_all(t)
        graph = capture_graph(lambda: self._forward(t), pool, self.device, self.model)
        self.graphs[t] = graph
        return graph

    @torch.inference_mode()
    def capture(self, pool=None, lazy: bool = False) -> GraphStats:
        """Capture every size, largest first, into ``pool`` (the decode graphs'; a new one if
        None), or with ``lazy`` none now: each size is then captured on its first use.
        Raises on a forward that is not capturable."""
        if self.device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need a CUDA device, not {self.device}.")
        dev = self.device
        start = time.perf_counter()
        torch.cuda.synchronize(dev)
        free_before = torch.cuda.mem_get_info(dev)[0]
        self._pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self._lazy = set(self.sizes) if lazy else set()
        if not lazy:
            for t in reversed(self.sizes):
                self._capture_one(t, self._pool)
        buffers = [self.input_ids, self.positions, self.slot_mapping, self.query_start_loc,
                   self.seq_lens, self.block_tables, self.last_rows]
        if self._own_logits:
            buffers.append(self.logits)
        return capture_stats(self.graphs, start, free_before, dev, buffers)

    def release(self) -> None:
        """Drop every graph (their pool memory returns on the next ``empty_cache``)."""
        release_graphs(self.graphs, self._lazy)
