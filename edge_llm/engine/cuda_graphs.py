"""CUDA graphs for decode steps: one graph per padded batch size, captured once, replayed.

A decode step of a 7B model is a few hundred short kernel launches; replaying them from a
graph removes the per-launch host cost (vLLM's default, switched off by ``--enforce-eager``).

Static buffers, ``max_bs`` rows (the largest captured size); the graph of size ``bs`` reads
rows ``[0, bs)``, a step of ``B <= bs`` sequences fills rows ``[0, B)`` and pads the rest::

    row          input_ids  positions  slot_mapping     seq_lens   block_tables[row, :W]
    b < B        its token  start_pos  its cache slot   start + 1  its table (W = widest)
    B <= b < bs  0          0          -1 (write_kv     1          0 ... (block 0: read,
                                        skips it)                   never written)

    forward(bs rows) -> compute_logits -> logits[:bs]   (fp32, one buffer shared by all sizes)

The sampler then reads ``logits[:B]``. Only decode-only steps replay (every sequence feeds one
token and none wants prompt logprobs); prefill and mixed steps, and steps of more than
``max_bs`` sequences, run eagerly.

Graph safety (what the captured forward may not do): read a device value on the host, or
launch a grid that depends on the step. The paged decode kernel sizes its context split from
the host int ``max_seq_len``: captured graphs pass ``max_model_len``, so the grid is fixed and
a short sequence leaves the later partitions empty (tests/test_decode_graph_interpret.py).
``query_start_loc`` (a host tensor) is not read by the decode kernel. Sizes are captured
largest first into one memory pool, so the smaller graphs reuse the larger ones' scratch.

Every graph, decode and prefill, is warmed up (through the model's first layer only) and
captured on one side stream per device (``graph_capture.capture_graph``).
"""

from __future__ import annotations

import bisect
import gc
import logging
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from edge_llm.config import MAX_CUDA_GRAPH_SIZE
from edge_llm.model.attention_metadata import AttentionMetadata

from .graph_capture import capture_graph
from .scheduler_output import ScheduledSeq

logger = logging.getLogger(__name__)


def _size_ladder():
    """1, 2, 4, 8, 16, 24, 32, then steps of half the last power of two (48, 64, 96, 128, 192,
    256, 384, 512): 15 graphs up to 512 instead of 67 multiples of 8 (each capture costs
    ~0.1 s of start-up for a 7B model). Padding rows are cheap in a decode step: the weights
    are read once whatever the row count, and a padding row attends to one slot."""
    yield from (1, 2, 4, 8, 16, 24, 32)
    size = 32
    while True:
        step = (1 << (size.bit_length() - 1)) // 2
        size += step
        yield size


def capture_sizes(max_num_seqs: int, limit: int = MAX_CUDA_GRAPH_SIZE) -> list[int]:
    """Padded batch sizes, ascending (``_size_ladder``), up to the first size >=
    ``max_num_seqs`` (so every batch the scheduler can form has a graph), at most ``limit``."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}.")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}.")
    sizes = []
    for size in _size_ladder():
        if size > limit:
            break
        sizes.append(size)
        if size >= max_num_seqs:
            break
    return sizes


def padded_size(sizes: list[int], batch: int) -> int | None:
    """The smallest size in ascending ``sizes`` that holds ``batch`` rows; None if none does."""
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) else None


def wants_prompt_logprobs(s: ScheduledSeq) -> bool:
    """This row (a ``ScheduledSeq``) produces prompt logprobs (its chunk holds prompt tokens
    whose successor is a prompt token)."""
    return s.seq.params.prompt_logprobs is not None and s.start_pos < s.seq.num_prompt_tokens - 1


def is_decode_step(scheduled: list[ScheduledSeq]) -> bool:
    """Every row feeds exactly one token and none wants prompt logprobs."""
    return bool(scheduled) and all(
        s.num_scheduled_tokens == 1 and not wants_prompt_logprobs(s) for s in scheduled
    )


@dataclass
class DecodeInputs:
    """One decode step's inputs on the host, padded to ``bs`` rows (layout: module doc)."""

    input_ids: torch.Tensor  # (bs,) int64
    positions: torch.Tensor  # (bs,) int64
    slot_mapping: torch.Tensor  # (bs,) int64, -1 on padding rows
    seq_lens: torch.Tensor  # (bs,) int32, 1 on padding rows
    block_tables: torch.Tensor  # (bs, W) int32, W = the longest table; zeros past each table


def decode_inputs(scheduled: list[ScheduledSeq], bs: int, block_size: int) -> DecodeInputs:
    """Flatten a decode step's rows (``ScheduledSeq`` with one token each) into ``bs`` rows."""
    b = len(scheduled)
    if not 0 < b <= bs:
        raise ValueError(f"a decode step of {b} rows does not fit {bs} padded rows.")
    pad = bs - b
    width = max(len(s.block_table) for s in scheduled)
    ids, positions, slots, seq_lens = [], [], [], []
    tables = np.zeros((bs, width), dtype=np.int32)
    for i, s in enumerate(scheduled):
        if s.num_scheduled_tokens != 1:
            raise ValueError(f"decode rows feed one token, got {s.num_scheduled_tokens}.")
        p = s.start_pos
        table = s.block_table
        ids.append(s.token_ids[0])
        positions.append(p)
        slots.append(table[p // block_size] * block_size + p % block_size)
        seq_lens.append(p + 1)
        tables[i, : len(table)] = table  # row by row: a third of torch.tensor(list of lists)
    return DecodeInputs(
        input_ids=torch.tensor(ids + [0] * pad, dtype=torch.int64),
        positions=torch.tensor(positions + [0] * pad, dtype=torch.int64),
        slot_mapping=torch.tensor(slots + [-1] * pad, dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens + [1] * pad, dtype=torch.int32),
        block_tables=torch.from_numpy(tables),
    )


@dataclass(frozen=True)
class GraphStats:
    """What the last capture made: its sizes, wall seconds, and the device memory it holds
    (graph pool, static buffers; measured as the drop in free device memory)."""

    sizes: tuple[int, ...] = ()
    seconds: float = 0.0
    memory_bytes: int = 0


def capture_stats(graphs: dict, start: float, free_before: int, device: torch.device,
                  buffers) -> GraphStats:
    """GraphStats of a capture that began at ``start`` (perf_counter) with ``free_before``
    bytes of device memory free: the sizes in ``graphs``, the seconds, and the memory held,
    the static ``buffers`` (tensors) included."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # the warm-up runs' cached blocks; the pool stays
    held = sum(t.numel() * t.element_size() for t in buffers)
    used = max(free_before - torch.cuda.mem_get_info(device)[0], 0) + held
    return GraphStats(tuple(sorted(graphs)), time.perf_counter() - start, used)


def release_graphs(graphs: dict, lazy: set) -> None:
    """Drop every graph (their pool memory returns on the next ``empty_cache``) and the sizes
    still waiting for a capture on first use."""
    for graph in graphs.values():
        graph.reset()
    graphs.clear()
    lazy.clear()


def capture_or_release(graphs, capture, eager: str) -> GraphStats | None:
    """``capture()``'s GraphStats; if it raises (an op that cannot be captured), ``graphs``
    is released, a warning names the error and that ``eager`` ("decode runs", "prefills
    run") eagerly, and None is returned."""
    try:
        return capture()
    except Exception as exc:
        graphs.release()
        torch.cuda.empty_cache()
        logger.warning("CUDA graph capture failed, %s eagerly (%s: %s)", eager,
                       type(exc).__name__, exc)
        return None


class DecodeGraphs:
    """Static decode buffers and the graphs captured over them (layout: module doc).

    ``run(scheduled)`` fills the buffers and replays the graph of the padded size; without a
    captured graph for that size (``capture`` not called: the CPU tests) it runs the same
    padded forward eagerly. ``release()`` drops the graphs and their pool (before the KV cache
    or the weights move: the graphs hold their device addresses).
    """

    def __init__(self, model, kv_layers: list, sizes: list[int], max_model_len: int,
                 block_size: int, device: torch.device) -> None:
        if not sizes or sorted(set(sizes)) != list(sizes) or sizes[0] < 1:
            raise ValueError(f"sizes must be ascending distinct positive ints, got {sizes}.")
        self.model = model
        self.kv_layers = kv_layers
        self.sizes = list(sizes)
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.device = device
        self.max_blocks = -(-max_model_len // block_size)
        max_bs, vocab = self.sizes[-1], model.arch.vocab_size
        with torch.inference_mode():
            self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
            self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
            self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.int64, device=device)
            self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
            self.block_tables = torch.zeros((max_bs, self.max_blocks), dtype=torch.int32,
                                            device=device)
            self.logits = torch.empty((max_bs, vocab), dtype=torch.float32, device=device)
        # read only by the torch reference (CPU): the decode kernel ignores it
        self._query_start_loc = torch.arange(max_bs + 1, dtype=torch.int32)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._lazy: set[int] = set()  # sizes captured on first use (see capture)
        self._pool = None
        self.replays: Counter[int] = Counter()  # padded size -> decode steps run at that size

    @property
    def pool(self):
        """The graphs' memory pool (None before ``capture``); the prefill graphs share it."""
        return self._pool

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def can_run(self, scheduled: list[ScheduledSeq]) -> bool:
        """A decode-only step of at most ``max_batch`` rows whose tables fit the buffer."""
        return (
            len(scheduled) <= self.max_batch
            and is_decode_step(scheduled)
            and max(len(s.block_table) for s in scheduled) <= self.max_blocks
        )

    def _forward(self, bs: int) -> None:
        """The captured body: forward and logits of static rows [0, bs) into logits[:bs]."""
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs],
            query_start_loc=self._query_start_loc[: bs + 1],
            seq_lens=self.seq_lens[:bs],
            block_tables=self.block_tables[:bs],
            max_query_len=1,
            max_seq_len=self.max_model_len,  # fixed split grid (module doc)
        )
        hidden = self.model(self.input_ids[:bs], self.positions[:bs], self.kv_layers, meta)
        self.logits[:bs].copy_(self.model.compute_logits(hidden))

    @torch.inference_mode()
    def run(self, scheduled: list[ScheduledSeq],
            input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, vocab) fp32 of a decode step (``can_run``), row i for ``scheduled[i]``;
        a view of the static buffer, valid until the next ``run``. ``input_ids`` (B,) int64
        on the device, if given, replaces the rows' ``token_ids`` (a run-ahead step feeds the
        tokens the step before it sampled, still on the device)."""
        b = len(scheduled)
        bs = padded_size(self.sizes, b)
        if bs is None:
            raise ValueError(f"{b} rows exceed the largest padded size {self.max_batch}.")
        host = decode_inputs(scheduled, bs, self.block_size)
        w = host.block_tables.shape[1]
        # pageable host sources: each copy returns once its source is staged
        self.input_ids[:bs].copy_(host.input_ids, non_blocking=True)
        self.positions[:bs].copy_(host.positions, non_blocking=True)
        self.slot_mapping[:bs].copy_(host.slot_mapping, non_blocking=True)
        self.seq_lens[:bs].copy_(host.seq_lens, non_blocking=True)
        self.block_tables[:bs, :w].copy_(host.block_tables, non_blocking=True)
        if input_ids is not None:
            self.input_ids[:b].copy_(input_ids)
        graph = self.graphs.get(bs)
        if graph is None and bs in self._lazy:
            graph = self._capture_one(bs, torch.cuda.graph_pool_handle() if self._pool is None
                                      else self._pool)  # first use of a deferred size
            self._lazy.discard(bs)
        if graph is not None:
            graph.replay()
        else:
            self._forward(bs)
        self.replays[bs] += 1
        return self.logits[:b]

    def _pad_all(self) -> None:
        """Every row padding: warm-up and capture runs write no KV (slot -1)."""
        self.input_ids.zero_()
        self.positions.zero_()
        self.slot_mapping.fill_(-1)
        self.seq_lens.fill_(1)
        self.block_tables.zero_()

    def _capture_one(self, bs: int, pool) -> torch.cuda.CUDAGraph:
        """Warm size ``bs`` up eagerly (compiles kernels, initialises cuBLAS), then capture it
        into ``pool``. The static inputs of rows [0, bs) are padding during both runs."""
        self._pool = pool
        saved = self._save_rows(bs)
        self._pad_rows(bs)
        graph = capture_graph(lambda: self._forward(bs), pool, self.device, self.model)
        self._restore_rows(saved)
        self.graphs[bs] = graph
        return graph

    def _save_rows(self, bs: int) -> list[torch.Tensor]:
        return [t[:bs].clone() for t in self._inputs()]

    def _restore_rows(self, saved: list[torch.Tensor]) -> None:
        for t, s in zip(self._inputs(), saved, strict=True):
            t[: s.shape[0]].copy_(s)

    def _inputs(self) -> list[torch.Tensor]:
        return [self.input_ids, self.positions, self.slot_mapping, self.seq_lens,
                self.block_tables]

    def _pad_rows(self, bs: int) -> None:
        self.input_ids[:bs].zero_()
        self.positions[:bs].zero_()
        self.slot_mapping[:bs].fill_(-1)
        self.seq_lens[:bs].fill_(1)
        self.block_tables[:bs].zero_()

    @torch.inference_mode()
    def capture(self, eager_max: int | None = None) -> GraphStats:
        """Capture every size (largest first, one shared pool), or with ``eager_max`` only the
        sizes up to it: the larger ones are then captured on their first use (a wake-up that
        must be quick). Raises on a forward that is not capturable."""
        if self.device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need a CUDA device, not {self.device}.")
        dev = self.device
        start = time.perf_counter()
        gc.collect()
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        free_before = torch.cuda.mem_get_info(dev)[0]
        self._pad_all()
        pool = torch.cuda.graph_pool_handle()
        now = [bs for bs in self.sizes if eager_max is None or bs <= eager_max]
        self._lazy = set(self.sizes) - set(now)
        for bs in reversed(now):
            self._capture_one(bs, pool)
        return capture_stats(self.graphs, start, free_before, dev, (
            self.input_ids, self.positions, self.slot_mapping, self.seq_lens,
            self.block_tables, self.logits))

    def release(self) -> None:
        """Drop every graph (their pool memory returns on the next ``empty_cache``)."""
        release_graphs(self.graphs, self._lazy)


def describe_sizes(sizes: tuple[int, ...] | list[int]) -> str:
    """Sizes for a log line: "1, 2, 4, 8, 16, ..., 256"."""
    if len(sizes) <= 6:
        return ", ".join(map(str, sizes))
    return ", ".join(map(str, sizes[:5])) + f", ..., {sizes[-1]}"
