"""CUDA graphs for single-sequence prefills of up to 512 new tokens (a chat prompt, a prompt's
last chunk, the uncached tail after a prefix-cache hit). On by default;
``EDGE_LLM_PREFILL_GRAPHS=0`` turns them off.

An eager prefill of a 7B model costs ~45 ms of Python launch overhead whatever its length, so
the 24 new tokens after a 1,000-token cached prefix take as long as the whole prompt, and a
128-token prompt's first token came after 50 ms on the H200 (session 25); a graph replay of
the same forward costs a few ms. Eligible steps (``is_short_prefill``): exactly ONE scheduled
sequence feeding ``2 <= n <= 512`` tokens, no prompt logprobs. ``n`` is padded up to the
smallest bucket ``T`` in ``PREFILL_SIZES`` (8, 16, ..., 512; ``prefill_sizes`` drops the
buckets a step of ``max_num_batched_tokens`` cannot reach); one graph per bucket.

Layout: the ``T`` rows form TWO sequences, the real one and a padding one::

    rows          input_ids   positions          slot_mapping    attention sequence
    i < n         token i     start + i          its cache slot  0: seq_len start + n,
                                                                    its block table
    n <= i < T    0           0                  -1 (write_kv    1: seq_len T - n,
                                                  skips it)         table of zeros (block 0:
                                                                    read, never written)
    query_start_loc (on the device) = [0, n, T]; seq_lens = [start + n, T - n]

    forward(T rows) -> row n - 1 (``last_row``, on the device) -> compute_logits -> logits
    (1, vocab) fp32: the one row the sampler reads (a (T, vocab) buffer would be 311 MB at
    512 rows of Qwen2.5's vocabulary).

Positions feed only the rotary embedding (the kernel places queries by ``seq_len``): padding
rows take 0, in range of the rotary table whatever ``max_model_len``.

Why a second sequence and not one sequence of ``seq_len = start + T``: the prefill kernel
loads keys up to the last position of a query tile, so the real rows of a tile that also holds
padding rows would load the unwritten slots ``start + n ..`` (``torch.empty`` memory, possibly
NaN). Their softmax weight is 0, but ``0 * NaN`` is NaN in ``p @ V``. With the padding as its
own sequence, the real sequence's attention is exactly the eager step's (same ``seq_len``,
``num_q`` and tiles), and the norms and linears are row-independent, so the real rows get the
eager rows' values up to the linears' row-count-dependent rounding: the K/V they write and the
last row's logits (tests/test_prefill_graphs.py).

Graph safety: the prefill kernel (kernels/paged_prefill.py) takes ``query_start_loc`` on the
device, computes its tiles there, and sizes its grid from ``T`` and ``num_seqs`` (= 2) only;
``max_query_len = T`` picks it without a host read; ``max_seq_len`` (read by the decode kernel
only) is ``max_model_len``. W4A16 linears take the path of their padded row count (above
64 rows on mma.sync and 128 on wgmma, dequantize + cuBLAS into the one reused buffer). CPU never
captures: ``PrefillGraphs.run`` without a captured graph runs the same padded forward eagerly
(the CPU tests' path). Graphs are captured at start-up after the decode graphs, into their pool;
dropped on sleep; after a wake captured on first use.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass

import torch

from edge_llm.model.attention_metadata import AttentionMetadata

from .cuda_graphs import (
    GraphStats,
    capture_graph,
    capture_stats,
    padded_size,
    release_graphs,
    wants_prompt_logprobs,
)

PREFILL_SIZES = (8, 16, 32, 64, 128, 256, 512)  # padded new-token counts, one graph each
MIN_TOKENS = 2  # one-token steps are decode steps (cuda_graphs.py)
ENV_FLAG = "EDGE_LLM_PREFILL_GRAPHS"


def prefill_graphs_enabled() -> bool:
    """On unless ``EDGE_LLM_PREFILL_GRAPHS=0`` (the GPU tests passed on the H200 and a
    prefix-cached 1,000-token prompt's first token came 4.4x sooner); any value but 0 or 1 is
    an error."""
    value = os.environ.get(ENV_FLAG, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{ENV_FLAG} must be 0 or 1, got {value!r}.")
    return value == "1"


def prefill_sizes(max_num_batched_tokens: int) -> tuple[int, ...]:
    """The buckets a one-sequence step of at most ``max_num_batched_tokens`` tokens can use:
    those below it and the first at or above it."""
    below = tuple(t for t in PREFILL_SIZES if t < max_num_batched_tokens)
    above = [t for t in PREFILL_SIZES if t >= max_num_batched_tokens][:1]
    return below + tuple(above)


def is_short_prefill(scheduled: list, max_tokens: int = PREFILL_SIZES[-1]) -> bool:
    """One sequence feeding ``MIN_TOKENS .. max_tokens`` tokens, no prompt logprobs."""
    if len(scheduled) != 1:
        return False
    s = scheduled[0]
    return MIN_TOKENS <= s.num_scheduled_tokens <= max_tokens and not wants_prompt_logprobs(s)


@dataclass
class PrefillInputs:
    """One short prefill's inputs on the host, padded to ``T`` rows (layout: module doc)."""

    input_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64
    slot_mapping: torch.Tensor  # (T,) int64, -1 on padding rows
    query_start_loc: torch.Tensor  # (3,) int32: [0, n, T]
    seq_lens: torch.Tensor  # (2,) int32: [start + n, T - n]
    block_tables: torch.Tensor  # (2, W) int32, W = len(table); row 1 zeros


def prefill_inputs(s, t: int, block_size: int) -> PrefillInputs:
    """Lay out one ``ScheduledSeq`` of ``n`` new tokens as ``t`` rows (module doc)."""
    n, start, table = s.num_scheduled_tokens, s.start_pos, s.block_table
    if not MIN_TOKENS <= n <= t:
        raise ValueError(f"a short prefill of {n} tokens does not fit {t} padded rows.")
    if len(s.token_ids) != n:
        raise ValueError(f"{len(s.token_ids)} token ids for {n} scheduled tokens.")
    if len(table) * block_size < start + n:
        raise ValueError(f"a table of {len(table)} blocks does not cover position "
                         f"{start + n - 1}.")
    pad = t - n
    slots = [table[p // block_size] * block_size + p % block_size for p in range(start, start + n)]
    return PrefillInputs(
        input_ids=torch.tensor(list(s.token_ids) + [0] * pad, dtype=torch.int64),
        positions=torch.tensor(list(range(start, start + n)) + [0] * pad, dtype=torch.int64),
        slot_mapping=torch.tensor(slots + [-1] * pad, dtype=torch.int64),
        query_start_loc=torch.tensor([0, n, t], dtype=torch.int32),
        seq_lens=torch.tensor([start + n, pad], dtype=torch.int32),
        block_tables=torch.tensor([list(table), [0] * len(table)], dtype=torch.int32),
    )


class PrefillGraphs:
    """Static buffers for ``max(sizes)`` rows and one graph per size over them.

    ``run(scheduled)`` (``can_run`` true) fills the buffers and replays the graph of the padded
    size, or without one (CPU; not captured) runs the same padded forward eagerly; it returns
    the logits of the real rows. ``release()`` drops the graphs (before the KV cache or the
    weights move). ``replays`` counts steps per padded size.
    """

    def __init__(self, model, kv_layers: list, max_model_len: int, block_size: int,
                 device: torch.device, sizes: tuple[int, ...] = PREFILL_SIZES) -> None:
        sizes = list(sizes)
        if not sizes or sorted(set(sizes)) != sizes or sizes[0] < MIN_TOKENS:
            raise ValueError(f"sizes must be ascending distinct ints >= {MIN_TOKENS}, "
                             f"got {sizes}.")
        self.model = model
        self.kv_layers = kv_layers
        self.sizes = sizes
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.device = device
        self.max_blocks = -(-max_model_len // block_size)
        rows, vocab = sizes[-1], model.arch.vocab_size
        # the padding sequence (up to rows - 2 tokens) reads row 1 up to its own length
        width = max(self.max_blocks, -(-rows // block_size))
        with torch.inference_mode():
            self.input_ids = torch.zeros(rows, dtype=torch.int64, device=device)
            self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
            self.slot_mapping = torch.full((rows,), -1, dtype=torch.int64, device=device)
            self.query_start_loc = torch.zeros(3, dtype=torch.int32, device=device)
            self.seq_lens = torch.zeros(2, dtype=torch.int32, device=device)
            self.block_tables = torch.zeros((2, width), dtype=torch.int32,
                                            device=device)
            self.last_row = torch.zeros(1, dtype=torch.int64, device=device)
            self.logits = torch.empty((1, vocab), dtype=torch.float32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._lazy: set[int] = set()
        self._pool = None
        self.replays: Counter[int] = Counter()

    def can_run(self, scheduled: list) -> bool:
        return (is_short_prefill(scheduled, self.sizes[-1])
                and len(scheduled[0].block_table) <= self.max_blocks)

    def _forward(self, t: int) -> None:
        """The captured body: forward of static rows [0, t), logits of row ``last_row``."""
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:t],
            query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens,
            block_tables=self.block_tables,
            max_query_len=t,
            max_seq_len=self.max_model_len,
        )
        hidden = self.model(self.input_ids[:t], self.positions[:t], self.kv_layers, meta)
        self.logits.copy_(self.model.compute_logits(hidden.index_select(0, self.last_row)))

    @torch.inference_mode()
    def run(self, scheduled: list) -> torch.Tensor:
        """Logits (1, vocab) fp32 of the last real row of a short prefill (``can_run``): the
        static buffer, valid until the next ``run``."""
        if not self.can_run(scheduled):
            raise ValueError("not a short single-sequence prefill that fits the buffers.")
        s = scheduled[0]
        t = padded_size(self.sizes, s.num_scheduled_tokens)
        if t in self._lazy:  # first use after a wake: capture before the inputs go in
            self._capture_one(t, self._pool if self._pool is not None
                              else torch.cuda.graph_pool_handle())
            self._lazy.discard(t)
        host = prefill_inputs(s, t, self.block_size)
        w = host.block_tables.shape[1]
        self.input_ids[:t].copy_(host.input_ids, non_blocking=True)
        self.positions[:t].copy_(host.positions, non_blocking=True)
        self.slot_mapping[:t].copy_(host.slot_mapping, non_blocking=True)
        self.query_start_loc.copy_(host.query_start_loc, non_blocking=True)
        self.seq_lens.copy_(host.seq_lens, non_blocking=True)
        self.block_tables[:, :w].copy_(host.block_tables, non_blocking=True)
        self.last_row.fill_(s.num_scheduled_tokens - 1)
        graph = self.graphs.get(t)
        if graph is not None:
            graph.replay()
        else:
            self._forward(t)
        self.replays[t] += 1
        return self.logits

    def _pad_all(self, t: int) -> None:
        """Every row padding (no real queries, nothing written): warm-up and capture runs."""
        self.input_ids.zero_()
        self.positions.zero_()
        self.slot_mapping.fill_(-1)
        self.query_start_loc.copy_(torch.tensor([0, 0, t], dtype=torch.int32))
        self.seq_lens.copy_(torch.tensor([0, t], dtype=torch.int32))
        self.block_tables.zero_()
        self.last_row.fill_(t - 1)

    def _capture_one(self, t: int, pool) -> torch.cuda.CUDAGraph:
        """Warm size ``t`` up eagerly, then capture it into ``pool`` (inputs all padding)."""
        self._pool = pool
        self._pad_all(t)
        graph = capture_graph(lambda: self._forward(t), pool, self.device)
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
        return capture_stats(self.graphs, start, free_before, dev, (
            self.input_ids, self.positions, self.slot_mapping, self.query_start_loc,
            self.seq_lens, self.block_tables, self.last_row, self.logits))

    def release(self) -> None:
        """Drop every graph (their pool memory returns on the next ``empty_cache``)."""
        release_graphs(self.graphs, self._lazy)
