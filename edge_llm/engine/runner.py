"""ModelRunner: turns a SchedulerOutput into one forward pass and sampled tokens.

It owns the KV cache tensors, applies swaps and copies (block-id pairs only: it never learns
request identities from them), flattens the scheduled tokens into one batch, and samples.
Decode-only steps replay CUDA graphs (``cuda_graphs.py``) unless ``enforce_eager`` is set or
the forward would not be capturable (CPU, fp32, ``EDGE_LLM_KERNELS=torch``); so do short
steps that prefill, up to 512 new tokens over one or more sequences, decode rows alongside
(``prefill_graphs.py``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import numpy as np
import torch

from edge_llm.config import CacheConfig, SchedulerConfig
from edge_llm.kernels import acquire_dequant_scratch, release_dequant_scratch, triton_enabled
from edge_llm.model.attention_metadata import AttentionMetadata
from edge_llm.model.cpu_decode import CpuDecoder, cpu_decode_supported, decode_threads
from edge_llm.model.loader import LoadedModel

from .cpu_threads import threads_at_most
from .cuda_graphs import (
    DecodeGraphs,
    GraphStats,
    capture_or_release,
    capture_sizes,
    describe_sizes,
    wants_prompt_logprobs,
)
from .kv_cache import KVCache, KVCachePlan, kv_storage_dtype, plan_kv_cache
from .pending_step import PendingStep, RunnerOutput
from .prefill_graphs import PrefillGraphs, prefill_sizes
from .sampler import Sampler, SampleRow, compute_prompt_logprobs
from .scheduler_output import ScheduledSeq, SchedulerOutput
from .startup_probes import (
    memory_probes,
    profile_graph_memory,
    profile_peak_memory,
    warm_up_kernels,
)

logger = logging.getLogger(__name__)

# decode graphs captured during a wake-up; larger batch sizes are captured on first use
WAKE_CAPTURE_MAX = 8


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        seed: int = 0,
        enforce_eager: bool = False,
        graph_sizes: tuple[int, ...] | None = None,
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.kv_dtype = kv_storage_dtype(cache_config, self.dtype)
        self.block_size = cache_config.block_size
        self.cache_config = cache_config
        self.scheduler_config = scheduler_config
        self.sampler = Sampler(seed=seed)
        self.enforce_eager = enforce_eager
        acquire_dequant_scratch()  # sleep releases it
        # decode graph sizes: the given ones, or the ladder up to max_num_seqs
        self.graph_sizes = (list(graph_sizes) if graph_sizes
                            else capture_sizes(scheduler_config.max_num_seqs))
        probes = self._memory_probes()
        self.graph_memory_estimate = probes["graph_bytes"]
        self.plan: KVCachePlan = plan_kv_cache(
            loaded.arch, cache_config, self.kv_dtype, self.device,
            scheduler_config.max_model_len, probes["peak_bytes"], self.graph_memory_estimate,
        )
        start = time.perf_counter()
        self.kv = KVCache(loaded.arch, self.plan, self.block_size, self.kv_dtype, self.device)
        logger.info(
            "KV cache: %d blocks of %d tokens (%.2f GiB, %s), %d CPU swap blocks, in %.2f s",
            self.plan.num_gpu_blocks, self.block_size,
            self.plan.num_gpu_blocks * self.plan.block_bytes / (1 << 30),
            "fp8 e4m3" if self.kv_dtype == torch.uint8 else str(self.dtype).removeprefix("torch."),
            self.plan.num_cpu_blocks, time.perf_counter() - start,
        )
        self._host_swap = None  # the swap space kept over a sleep
        self._scratch_sizes = []  # the reused dequantization buffers dropped by a sleep
        self.graphs: DecodeGraphs | None = None
        self.graph_stats = GraphStats()
        self.prefill_graphs: PrefillGraphs | None = None
        self.prefill_graph_stats = GraphStats()
        # forwards launched, by how: "decode_graph", "short_graph" (prefill_graphs.py), "eager"
        self.step_paths: Counter[str] = Counter()
        # CPU decode steps in fewer ops (model/cpu_decode.py) where the layers allow it
        self.cpu_decode = self.device.type == "cpu" and cpu_decode_supported(self.model)
        self.cpu_decoder = self._cpu_decoder()
        self.decode_threads = decode_threads(loaded.arch) if self.cpu_decode else None
        self.kernel_warmup_seconds = warm_up_kernels(
            self.model, self.block_size, self.dtype, self.device,
            min(scheduler_config.max_num_batched_tokens, scheduler_config.max_model_len),
            kv_dtype=self.kv_dtype)
        self._capture_graphs()

    # ---- CUDA graphs -----------------------------------------------------------------------
    @property
    def wants_cuda_graphs(self) -> bool:
        """CUDA with the Triton kernels, and not ``enforce_eager``."""
        return (not self.enforce_eager and self.device.type == "cuda"
                and triton_enabled(self.device, self.dtype))

    def _capture_graphs(self, eager_max: int | None = None) -> None:
        """Capture the decode graphs over the current KV cache and weights (start-up: all
        sizes; wake: sizes up to ``eager_max`` now, the others on first use)."""
        if not self.wants_cuda_graphs:
            if not self.enforce_eager and self.device.type == "cuda":
                logger.info("CUDA graphs off: the %s forward runs the torch reference kernels",
                            self.dtype)
            return
        graphs = DecodeGraphs(self.model, self.kv.layers, self.graph_sizes,
                              self.scheduler_config.max_model_len, self.block_size, self.device)
        stats = capture_or_release(graphs, lambda: graphs.capture(eager_max), "decode runs")
        if stats is None:
            return
        self.graphs, self.graph_stats = graphs, stats
        logger.info("CUDA graphs: %d decode graphs (batch sizes %s) captured in %.2f s, "
                    "%.0f MiB", len(stats.sizes), describe_sizes(stats.sizes), stats.seconds,
                    stats.memory_bytes / (1 << 20))
        self._capture_prefill_graphs(graphs.pool, lazy=eager_max is not None)
        held = self.graph_stats.memory_bytes + self.prefill_graph_stats.memory_bytes
        if (eager_max is None and self.plan.graph_bytes
                and held > self.plan.graph_bytes * 1.1 + (64 << 20)):
            logger.warning("The CUDA graphs hold %.0f MiB, more than the %.0f MiB the KV "
                           "cache plan set aside for them", held / (1 << 20),
                           self.plan.graph_bytes / (1 << 20))

    def _capture_prefill_graphs(self, pool, lazy: bool) -> None:
        """Short-step graphs (engine/prefill_graphs.py) into the decode graphs' pool, writing
        their logits buffer (start-up: every size now; wake: each on first use). A failure
        logs a warning and leaves prefill and mixed steps eager."""
        sc = self.scheduler_config
        graphs = PrefillGraphs(self.model, self.kv.layers, sc.max_model_len, self.block_size,
                               self.device, prefill_sizes(sc.max_num_batched_tokens),
                               max_seqs=sc.max_num_seqs, logits=self.graphs.logits)
        stats = capture_or_release(graphs, lambda: graphs.capture(pool, lazy=lazy),
                                   "prefills run")
        if stats is None:
            return
        self.prefill_graphs, self.prefill_graph_stats = graphs, stats
        logger.info("CUDA graphs: %d prefill graphs (new tokens %s%s) in %.2f s, %.0f MiB",
                    len(graphs.sizes), describe_sizes(graphs.sizes),
                    ", captured on first use" if lazy else "", stats.seconds,
                    stats.memory_bytes / (1 << 20))

    def short_step_tokens(self) -> int | None:
        """The most new tokens a step may have and still replay a short-step graph (None:
        no such graphs)."""
        return self.prefill_graphs.sizes[-1] if self.prefill_graphs is not None else None

    def _drop_graphs(self) -> None:
        if self.graphs is not None:
            self.graphs.release()
        self.graphs = None
        self.graph_stats = GraphStats()
        if self.prefill_graphs is not None:
            self.prefill_graphs.release()
        self.prefill_graphs = None
        self.prefill_graph_stats = GraphStats()

    # ---- scale to zero: free the device, come back ----------------------------------------
    def sleep(self, level: int) -> None:
        """Free the KV cache; level 1 keeps the weights in (pinned) host memory, level 2 drops
        them (``wake_up`` then reloads from disk). The CUDA graphs go first: they hold the
        device addresses of both. A dropped run-ahead step may still be running: wait."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._drop_graphs()
        self._scratch_sizes = release_dequant_scratch()
        self._host_swap = self.kv.host  # host memory stays: the next wake reuses it
        self.kv = None
        if level == 2:
            self.model = self.loaded.model = self.cpu_decoder = None
        elif self.device.type == "cuda":
            _move_tensors(self.model, torch.device("cpu"), pin=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake_up(self, reload) -> None:
        """Weights back on the device (``reload()`` returns a fresh LoadedModel after level 2),
        then the same KV plan allocated again and the CUDA graphs captured over them."""
        if self.model is None:
            self.loaded = reload()
            self.model = self.loaded.model
            self.cpu_decoder = self._cpu_decoder()
        elif self.device.type == "cuda":
            _move_tensors(self.model, self.device, pin=False)
        self.kv = KVCache(self.loaded.arch, self.plan, self.block_size, self.kv_dtype,
                          self.device, host=self._host_swap)
        acquire_dequant_scratch(self._scratch_sizes)
        self._scratch_sizes = []
        self._capture_graphs(eager_max=WAKE_CAPTURE_MAX)

    def _memory_probes(self) -> dict[str, int]:
        """The KV plan's measurements, or an earlier start's (startup_probes.memory_probes)."""
        values, self.probes_reused = memory_probes(self)
        return values

    def measure_peak_memory(self) -> int:
        """Peak device memory of a whole step's forward (startup_probes.py); 0 off CUDA."""
        return profile_peak_memory(self.model, self.loaded.arch.vocab_size,
                                   self.scheduler_config, self.block_size, self.dtype,
                                   self.device)

    def measure_graph_memory(self) -> int:
        """The graphs' memory for the KV plan (startup_probes.py); 0 without graphs."""
        if not self.wants_cuda_graphs:
            return 0
        sc = self.scheduler_config
        return profile_graph_memory(self.model, self.graph_sizes[-1],
                                    prefill_sizes(sc.max_num_batched_tokens)[-1],
                                    sc.max_model_len, self.block_size, self.kv_dtype,
                                    self.device)

    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        """Apply swap-out, swap-in, copies; run the scheduled tokens; sample ``do_sample`` rows."""
        return self.launch(sched).collect()

    @torch.inference_mode()
    def launch(self, sched: SchedulerOutput) -> PendingStep:
        """``execute`` up to the host's wait for the sampled tokens: on a GPU the step's
        kernels are queued when this returns (prompt logprobs, when asked for, are read
        here). ``collect()`` on the result finishes it."""
        for seq_id in sched.finished_seq_ids:
            self.sampler.forget(seq_id)
        self.kv.swap_out(sched.blocks_to_swap_out)
        self.kv.swap_in(sched.blocks_to_swap_in)
        self.kv.copy(sched.blocks_to_copy)
        step = PendingStep(RunnerOutput())
        out = step.out
        if not sched.scheduled:
            return step
        rows = [s for s in sched.scheduled if s.do_sample]
        for path, graphs in (("decode_graph", self.graphs), ("short_graph", self.prefill_graphs)):
            if graphs is not None and graphs.can_run(sched.scheduled):
                self.step_paths[path] += 1
                logits = graphs.run(sched.scheduled)  # (B, vocab), row i: scheduled[i]
                if len(rows) != len(sched.scheduled):  # a prompt's chunk before its last
                    logits = logits[[i for i, s in enumerate(sched.scheduled) if s.do_sample]]
                if rows:
                    self._sample(logits, rows, step)
                return step
        self.step_paths["eager"] += 1
        ids, positions, meta, sample_idx, prompt_rows = self._prepare(sched.scheduled)
        hidden = self._forward(ids, positions, meta)
        if rows:
            self._sample(self.model.compute_logits(hidden[sample_idx]), rows, step)
        for s, lo, _hi in prompt_rows:
            k = s.seq.params.prompt_logprobs
            targets = self._prompt_targets(s)
            n = len(targets)  # rows whose next token is a prompt token
            logits = self.model.compute_logits(hidden[lo : lo + n])
            out.prompt_logprobs[s.seq.seq_id] = (s.start_pos + 1, compute_prompt_logprobs(
                logits, torch.tensor(targets, device=logits.device), k
            ))
        return step

    # ---- decode run-ahead (engine/scheduler_ahead.py) ---------------------------------------
    def chain_index(self, sched: SchedulerOutput, pending: PendingStep) -> list[int] | None:
        """Where each row of ``sched`` finds the token ``pending`` (launched for it) samples
        on the device: indices into ``pending.tokens``, or None when some row has none or its
        sampling follows rules a run-ahead step may not (``Sampler.chainable``). A run-ahead
        step adopted for ``sched`` may hold more rows than ``sched`` (sequences that stopped)."""
        if pending.tokens is None or pending.sampling is None:
            return None
        rows, sample_rows, _ = pending.sampling
        at = {s.seq.seq_id: i for i, s in enumerate(rows)}
        index = [at.get(s.seq.seq_id, -1) for s in sched.scheduled]
        if -1 in index or not all(Sampler.chainable(sample_rows[i]) for i in index):
            return None
        return index

    def launch_ahead(self, rows: list[ScheduledSeq], index: list[int],
                     pending: PendingStep) -> PendingStep:
        """Launch the decode step ``rows`` (``scheduler_ahead.plan_ahead``) before ``pending``
        is collected: row i feeds the token ``pending`` sampled at ``index[i]``."""
        ids = pending.tokens
        if index != list(range(ids.numel())):
            ids = ids.index_select(0, torch.tensor(index, device=ids.device))
        step = PendingStep(RunnerOutput())
        step.generators = self.sampler.snapshot(  # only seeded rows own a generator
            [s.seq.seq_id for s in rows if s.seq.params.seed is not None])
        if self.graphs is not None and self.graphs.can_run(rows):
            self.step_paths["decode_graph"] += 1
            logits = self.graphs.run(rows, input_ids=ids)
        else:
            self.step_paths["eager"] += 1
            _, positions, meta, sample_idx, _ = self._prepare(rows)
            hidden = self._forward(ids, positions, meta)
            logits = self.model.compute_logits(hidden[sample_idx])
        self._sample(logits, rows, step)
        return step

    def _cpu_decoder(self) -> CpuDecoder | None:
        """The CPU decode path over the current model, where it serves it."""
        return CpuDecoder(self.model) if self.cpu_decode else None

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor,
                 meta: AttentionMetadata) -> torch.Tensor:
        """The model's final hidden states of the step's tokens (T, hidden)."""
        if self.cpu_decode and self.cpu_decoder is not None:
            with threads_at_most(self.decode_threads):
                hidden = self.cpu_decoder(ids, positions, self.kv.layers, meta)
            if hidden is not None:
                return hidden
        return self.model(ids, positions, self.kv.layers, meta)

    def drop(self, step: PendingStep) -> None:
        """Forget the run-ahead ``step`` (not the scheduled one): its sampling generators go
        back to where they were, so the scheduled step draws what it would have drawn."""
        if step.generators is not None:
            self.sampler.restore(step.generators)
            step.generators = None

    def adopt(self, sched: SchedulerOutput, step: PendingStep) -> PendingStep:
        """Take the run-ahead ``step`` as the launch of ``sched`` (``ahead_matches``): only
        the bookkeeping ``launch`` does before its forward is left to do."""
        for seq_id in sched.finished_seq_ids:
            self.sampler.forget(seq_id)
        return step

    def _sample(self, logits: torch.Tensor, rows: list[ScheduledSeq], step: PendingStep) -> None:
        """Queue sampling one token per row of ``logits`` (row i belongs to ``rows[i]``);
        ``step.collect()`` reads the tokens."""
        sample_rows = [
            SampleRow(
                params=s.seq.params,
                prompt_token_ids=s.seq.prompt_token_ids,
                output_token_ids=s.seq.output_token_ids,
                generator_key=s.seq.seq_id,
                choice_index=s.seq.index,
                matcher=s.seq.matcher,
            )
            for s in rows
        ]
        step.set_sampling(rows, sample_rows, self.sampler.sample_on_device(logits, sample_rows))

    @staticmethod
    def _prompt_targets(s: ScheduledSeq) -> list[int]:
        prompt = s.seq.prompt_token_ids
        end = min(s.start_pos + s.num_scheduled_tokens, len(prompt) - 1)
        return prompt[s.start_pos + 1 : end + 1]

    def _prepare(self, scheduled: list[ScheduledSeq]):
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        qsl = [0]
        seq_lens: list[int] = []
        sample_idx: list[int] = []
        prompt_rows = []
        max_blocks = max(len(s.block_table) for s in scheduled)
        tables = np.zeros((len(scheduled), max_blocks), dtype=np.int32)
        for i, s in enumerate(scheduled):
            n = s.num_scheduled_tokens
            start = s.start_pos
            ids.extend(s.token_ids)
            positions.extend(range(start, start + n))
            table = s.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            if wants_prompt_logprobs(s):
                prompt_rows.append((s, qsl[-1], qsl[-1] + n))
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
            if s.do_sample:
                sample_idx.append(qsl[-1] - 1)
            tables[i, : len(table)] = table
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.from_numpy(tables).to(dev),
            max_query_len=max(s.num_scheduled_tokens for s in scheduled),
            max_seq_len=max(seq_lens),
        )
        return (
            torch.tensor(ids, dtype=torch.int64, device=dev),
            torch.tensor(positions, dtype=torch.int64, device=dev),
            meta,
            torch.tensor(sample_idx, dtype=torch.int64, device=dev),
            prompt_rows,
        )


def _move_tensors(module: torch.nn.Module, device: torch.device, pin: bool) -> None:
    """Move every parameter and buffer in place (module objects, and tied parameters, stay
    shared), host copies pinned so the way back is a fast DMA."""
    moved: dict[int, torch.Tensor] = {}
    for m in module.modules():
        own = [*m.named_parameters(recurse=False, remove_duplicate=False),
               *m.named_buffers(recurse=False, remove_duplicate=False)]
        for name, t in own:
            if id(t) not in moved:
                data = t.detach().to(device, non_blocking=True)
                if pin and data.device.type == "cpu":
                    data = data.pin_memory()
                moved[id(t)] = (torch.nn.Parameter(data, requires_grad=False)
                                if isinstance(t, torch.nn.Parameter) else data)
            setattr(m, name, moved[id(t)])  # a parameter stays one, a buffer stays one
        drop = getattr(m, "drop_cpu_cache", None)  # QuantLinear's CPU forms of the weight
        if drop is not None:
            drop()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
