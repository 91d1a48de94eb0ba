"""What the runner measures and compiles at start-up with scratch forwards, before serving:
the activations' peak memory and the CUDA graphs' memory (for the KV plan), and every Triton
variant a prefill can need (kernel warm-up). CUDA only: elsewhere each returns 0."""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from edge_llm.config import SchedulerConfig
from edge_llm.kernels import triton_enabled
from edge_llm.model.full_forward import scratch_prefill

from .cuda_graphs import DecodeGraphs
from .graph_capture import warmup_forward, warmup_layers
from .prefill_graphs import PrefillGraphs
from .probe_cache import cached_probes, probe_dir, probe_environment, source_digest

logger = logging.getLogger(__name__)

# prefill token counts that reach every W4A16 launch variant before the first request
# (kernels/w4a16_config.py: 1-4 rows on the fp16x2 path, tl.dot tiles of 16/32/64 rows,
# 128-row tiles at 65-128 on Hopper with plane-packed words, dequantize + cuBLAS above);
# the kernels do not specialise on the row count itself
WARMUP_TOKENS = (1, 2, 3, 4, 5, 17, 33, 65, 129)
# and one prefill of two sequences: Triton compiles the attention kernels apart for one
# sequence and several (an integer argument equal to 1 is specialised). The memory probe's
# whole-step forward used to be the first to reach the several-sequence variants; when its
# result comes from the probe cache (probe_cache.py) it does not run.
WARMUP_TWO_SEQUENCES = 34
# and two sequences planned as if their context were this long: few queries over a long
# context split their keys (kernels/paged_prefill.py), a variant of its own, once with
# programmatic dependent launch (a forward of at most 4 tokens, kernels/pdl.py) and once not
WARMUP_SPLIT_CONTEXT = 4096
WARMUP_SPLIT_STEPS = ((4, 2), (WARMUP_TWO_SEQUENCES, WARMUP_TWO_SEQUENCES // 2))


@torch.inference_mode()
def warm_up_kernels(model, block_size: int, dtype: torch.dtype, device: torch.device,
                    max_tokens: int, kv_dtype: torch.dtype | None = None) -> float:
    """One eager forward per ``WARMUP_TOKENS`` count up to ``max_tokens`` over a scratch
    cache, and one of two sequences, so that every Triton variant a prefill can need is
    compiled (or loaded from the cache directory) before serving. Each runs the first layer of
    each kind only (``CausalLM.first_layers``, ``graph_capture.warmup_layers``): the others
    launch the same variants, and an eager forward of a 7B costs ~45 ms of Python on the GPU
    host. CUDA with the Triton kernels only; returns the seconds spent. ``kv_dtype``: the KV
    cache's (default ``dtype``; an fp8 cache's attention and K/V-write kernels are variants
    of their own)."""
    if device.type != "cuda" or not triton_enabled(device, dtype):
        return 0.0
    start = time.perf_counter()
    counts = [t for t in WARMUP_TOKENS if t <= max_tokens]
    steps = [(t, t, None) for t in counts]
    two = WARMUP_TWO_SEQUENCES
    if two <= max_tokens:
        steps.append((two, two // 2, None))
    steps += [(t, per_seq, WARMUP_SPLIT_CONTEXT) for t, per_seq in WARMUP_SPLIT_STEPS
              if t <= max_tokens]
    for t, per_seq, context in steps:
        kv, meta = scratch_prefill(model, t, block_size, kv_dtype or dtype, device,
                                   max_seq_len=per_seq,
                                   num_layers=warmup_layers(model.arch))
        if context is not None:
            meta = dataclasses.replace(meta, max_seq_len=context)
        ids = torch.zeros(t, dtype=torch.int64, device=device)
        positions = torch.arange(t, device=device) % per_seq
        with warmup_forward(model):  # the other layers launch the same variants
            hidden = model(ids, positions, kv, meta)
        model.compute_logits(hidden[-1:])
        del kv, hidden
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    logger.info("Kernel warm-up: prefills of %s tokens%s in %.2f s",
                ", ".join(map(str, counts)),
                f" and 2 x {two // 2}" if two <= max_tokens else "", seconds)
    return seconds


@torch.inference_mode()
def profile_peak_memory(model, vocab_size: int, scheduler_config: SchedulerConfig,
                        block_size: int, dtype: torch.dtype, device: torch.device) -> int:
    """Peak device memory of the weights plus the largest batch's activations (CUDA), the
    reused dequantization buffer (kernels/w4a16_dequant.py) included."""
    if device.type != "cuda":
        return 0
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    # a step's full token budget, in sequences of at most max_model_len (one sequence
    # of max_model_len measured half the activations of LLM's 8,192-token steps)
    tokens = scheduler_config.max_num_batched_tokens
    kv, meta = scratch_prefill(model, tokens, block_size, dtype, device,
                               max_seq_len=scheduler_config.max_model_len)
    ids = torch.randint(0, vocab_size, (tokens,), device=device)
    positions = torch.cat([torch.arange(n) for n in meta.seq_lens.tolist()])
    hidden = model(ids, positions.to(device), kv, meta)
    rows = min(scheduler_config.max_num_seqs, tokens)
    model.compute_logits(hidden[:rows]).softmax(-1)
    torch.cuda.synchronize(device)
    # reserved, not allocated: what the caching allocator holds, its rounding included
    peak = torch.cuda.max_memory_reserved(device)
    kv_bytes = sum(k.numel() * k.element_size() * 2 for k, _ in kv)
    del kv, hidden
    torch.cuda.empty_cache()
    return peak - kv_bytes


@torch.inference_mode()
def profile_graph_memory(model, largest: int, largest_prefill: int, max_model_len: int,
                         block_size: int, kv_dtype: torch.dtype, device: torch.device) -> int:
    """Device memory the CUDA graphs will hold, for the KV plan to set aside: the decode
    graph of ``largest`` rows and the prefill graph of ``largest_prefill`` new tokens (the
    largest of each) captured into one pool over a one-block scratch cache, measured, then
    dropped. The smaller sizes, captured after the largest into the same pool, reuse its
    scratch (their own part is the static buffers, a few MiB). 0 when the capture fails (the
    runner's own capture says why). The caller checks that graphs are wanted at all."""
    start = time.perf_counter()
    kv, _ = scratch_prefill(model, block_size, block_size, kv_dtype, device)
    decode = DecodeGraphs(model, kv, [largest], max_model_len, block_size, device)
    prefill = None
    try:
        held = decode.capture().memory_bytes
        prefill = PrefillGraphs(model, kv, max_model_len, block_size, device,
                                sizes=(largest_prefill,), max_seqs=largest,
                                logits=decode.logits)
        held += prefill.capture(decode.pool).memory_bytes
    except Exception as exc:
        logger.debug("graph memory probe failed (%s: %s)", type(exc).__name__, exc)
        held = 0
    finally:
        decode.release()
        if prefill is not None:
            prefill.release()
        del decode, prefill, kv
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    logger.info("CUDA graph memory: %.0f MiB set aside (batch %d and %d-token prefill "
                "graphs captured over a scratch cache in %.2f s)", held / (1 << 20),
                largest, largest_prefill, time.perf_counter() - start)
    return held


def memory_probes(runner) -> tuple[dict[str, int], bool]:
    """The KV plan's two measurements for ``runner`` (a ModelRunner): the peak memory of a
    whole step (``measure_peak_memory``) and the CUDA graphs' memory
    (``measure_graph_memory``), which only a fraction-of-the-card budget subtracts (an
    explicit KV size is the KV alone). On CUDA they are kept on disk for the next start
    with the same model and settings (probe_cache.py). Returns (values, whether they came
    from an earlier start)."""
    cc = runner.cache_config
    sized = cc.kv_cache_memory is None and cc.num_gpu_blocks_override is None

    def measure() -> dict[str, int]:
        return {"peak_bytes": runner.measure_peak_memory(),
                "graph_bytes": runner.measure_graph_memory() if sized else 0}

    if runner.device.type != "cuda":
        return measure(), False  # nothing to measure: zeros
    values, reused = cached_probes(probe_parts(runner, sized), measure)
    if reused:
        logger.info("Memory probes: %.2f GiB peak, %.0f MiB of CUDA graphs, as measured by "
                    "an earlier start (%s; EDGE_LLM_PROBE_CACHE=0 measures again)",
                    values["peak_bytes"] / (1 << 30), values["graph_bytes"] / (1 << 20),
                    probe_dir())
    return values, reused


def probe_parts(runner, sized: bool) -> dict:
    """What the memory probes' results depend on (the probe cache's key)."""
    import triton

    props = torch.cuda.get_device_properties(runner.device)
    return {
        "arch": dataclasses.asdict(runner.loaded.arch),
        "quant": repr(runner.loaded.quant_spec),
        "allocated": torch.cuda.memory_allocated(runner.device),  # the weights as loaded
        "dtype": str(runner.dtype), "kv_dtype": str(runner.kv_dtype),
        "block_size": runner.block_size,
        "scheduler": dataclasses.asdict(runner.scheduler_config),
        "graphs": runner.wants_cuda_graphs, "sized": sized,
        "graph_sizes": list(runner.graph_sizes),
        "gpu": [props.name, props.total_memory, props.major, props.minor],
        # the package's version is in its source (source_digest)
        "versions": [torch.__version__, torch.version.cuda, triton.__version__,
                     source_digest()],
        "env": probe_environment(),
    }
