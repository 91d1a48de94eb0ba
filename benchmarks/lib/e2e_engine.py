"""Engine scenarios of the end-to-end benchmark, in process on one loaded ``edge_llm.LLM``.

Every timed call uses fresh random prompts (``PromptMaker``), greedy sampling and
``ignore_eos``, and checks that each request produced exactly the tokens asked for. A decode
step's time is taken as ``(T(n tokens) - T(1 token)) / (n - 1)`` for the same batch shape, so
the prefill and the first sample drop out.

Two scenarios change the engine between runs without reloading the weights, as ``wake_up``
does: ``set_prefix_caching`` builds a new scheduler with the prefix cache on or off, and
``resize_kv_cache`` drops the CUDA graphs (they hold the KV tensors' addresses), frees the KV
tensors, allocates a new plan and captures the graphs again (the engine must be idle). Both
use the runner's private graph methods, as its own sleep / wake_up do.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

from .e2e_common import (
    Profile,
    PromptMaker,
    decode_bytes_per_step,
    free_device_memory,
    log,
)

# llama.cpp on this GPU, Llama-2-7B Q4_0, 64 sequences of 512-token prompts (issue #7)
LLAMA_CPP_PREFILL_TOK_S = 12200.0
LLAMA_CPP_GEN_TOK_S = 3861.0


def load_llm(path, p: Profile, device: str):
    from edge_llm import LLM

    return LLM(str(path), device=device, max_model_len=p.max_model_len,
               kv_cache_memory=p.kv_cache_memory, kv_cache_dtype=p.kv_cache_dtype,
               swap_space=4.0 if device.startswith("cuda") else 0.0625)


@dataclass
class EngineBench:
    llm: Any
    profile: Profile
    device: str
    prompts: PromptMaker
    copy_gbs: float  # measured device copy bandwidth, bytes read + written per second / 1e9
    matmul_tflops: float = 0.0  # measured large fp16 matmul rate (0: no offline floor)

    @property
    def engine(self):
        return self.llm.engine

    @property
    def arch(self):
        return self.engine.loaded.arch

    def generate(self, prompts: list[list[int]], params) -> tuple[float, list]:
        """Seconds for ``LLM.generate`` of token-id prompts (outputs are on the host, so the
        device work is done), and the outputs; every request must give its max_tokens."""
        began = time.perf_counter()
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                 use_tqdm=False)
        seconds = time.perf_counter() - began
        wanted = [q.max_tokens for q in params] if isinstance(params, list) else \
            [params.max_tokens] * len(prompts)
        got = [len(o.outputs[0].token_ids) for o in outs]
        if got != wanted:
            raise RuntimeError(f"requests gave {got[:8]} tokens, asked for {wanted[:8]}")
        return seconds, outs

    def warm(self, batch: int, prompt_len: int, tokens: int = 4) -> None:
        """Compile the kernels of this batch shape before anything is timed."""
        self.generate(self.prompts.batch(batch, prompt_len), greedy(tokens))

    def preemptions(self) -> int:
        return int(self.engine.stats()["num_preemptions"])

    def run_ahead(self) -> dict[str, int]:
        """Decode run-ahead steps so far (engine/scheduler_ahead.py): adopted / dropped."""
        return {k: int(self.engine.ahead_steps[k]) for k in ("adopted", "dropped")}


def greedy(n: int):
    from edge_llm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def kv_elem_bytes(bench: EngineBench) -> int:
    import torch

    return torch.tensor([], dtype=bench.engine.runner.kv_dtype).element_size()


def decode_seconds(outs: list) -> float:
    """Seconds from the first request's first token to the last request's last token of one
    ``generate`` call, from the engine's own timestamps: one span of one run, so it cannot go
    negative the way a difference of two runs' wall times can on a loaded machine. Every
    request must have produced at least two tokens."""
    metrics = [o.metrics for o in outs]
    if any(m is None or m.first_token_time is None or m.last_token_time is None
           for m in metrics):
        raise RuntimeError("outputs without token timestamps")
    span = max(m.last_token_time for m in metrics) - min(m.first_token_time for m in metrics)
    if span <= 0:
        raise RuntimeError(f"decode span {span:.6f} s: the clock did not advance")
    return span


def decode_at(bench: EngineBench, batch: int, prompt_len: int, tokens: int) -> dict[str, Any]:
    """Decode ``tokens`` for ``batch`` fresh prompts of ``prompt_len``: step time, tok/s and
    the fraction of the bandwidth floor (bytes a step must read / copy bandwidth)."""
    if tokens < 2:
        raise ValueError(f"decode needs at least 2 tokens, got {tokens}")
    bench.warm(batch, prompt_len)
    t1, _ = bench.generate(bench.prompts.batch(batch, prompt_len), greedy(1))
    ahead = bench.run_ahead()
    tn, outs = bench.generate(bench.prompts.batch(batch, prompt_len), greedy(tokens))
    ahead = {k: v - ahead[k] for k, v in bench.run_ahead().items()}
    step = decode_seconds(outs) / (tokens - 1)
    nbytes = decode_bytes_per_step(bench.engine.runner.model, bench.arch, batch,
                                   prompt_len + tokens / 2, kv_elem_bytes(bench))
    floor = nbytes["total"] / (bench.copy_gbs * 1e9)
    return {
        "batch": batch, "prompt": prompt_len, "tokens": tokens,
        "first_token_s": t1, "total_s": tn, "step_ms": step * 1e3,
        "decode_tok_s": batch / step, "e2e_tok_s": batch * tokens / tn,
        "bytes_per_step": nbytes, "floor_ms": floor * 1e3, "bandwidth_fraction": floor / step,
        "run_ahead_steps": ahead,
    }


def scenario_decode(bench: EngineBench) -> dict[str, Any]:
    p = bench.profile
    res = {}
    for batch in p.decode_batches:
        r = decode_at(bench, batch, p.decode_prompt, p.decode_tokens)
        log.info("decode b%d: %.1f tok/s, step %.2f ms, %.0f%% of the bandwidth floor", batch,
                 r["decode_tok_s"], r["step_ms"], 100 * r["bandwidth_fraction"])
        res[f"b{batch}"] = r
    return res


def scenario_offline(bench: EngineBench, work: list[tuple[list[int], int]]) -> dict[str, Any]:
    """All requests at once (the engine batches them): output and total tokens per second."""
    bench.warm(min(8, len(work)), bench.profile.offline_prompt[0])
    params = [greedy(n) for _, n in work]
    before, ahead = bench.preemptions(), bench.run_ahead()
    seconds, _ = bench.generate([w[0] for w in work], params)
    out_tokens = sum(n for _, n in work)
    prompt_tokens = sum(len(w[0]) for w in work)
    log.info("offline: %d requests, %.0f output tok/s", len(work), out_tokens / seconds)
    res = {"requests": len(work), "prompt_tokens": prompt_tokens, "output_tokens": out_tokens,
           "seconds": seconds, "output_tok_s": out_tokens / seconds,
           "total_tok_s": (out_tokens + prompt_tokens) / seconds,
           "preemptions": bench.preemptions() - before,
           "run_ahead_steps": {k: v - ahead[k] for k, v in bench.run_ahead().items()}}
    if bench.matmul_tflops > 0:
        from .e2e_floor import offline_floor

        floor = offline_floor(bench.arch, [(len(w[0]), w[1]) for w in work], bench.copy_gbs,
                              bench.matmul_tflops, kv_elem_bytes(bench))
        res["floor"] = floor
        res["floor_fraction"] = floor["sequential_s"] / seconds
        log.info("offline floor: %.2f s sequential (KV %.2f s + matmuls %.2f s), %.2f s "
                 "overlapped; this run reached %.2f of the sequential floor",
                 floor["sequential_s"], floor["kv_seconds"], floor["matmul_seconds"],
                 floor["overlapped_s"], res["floor_fraction"])
    return res


def scenario_gen(bench: EngineBench) -> dict[str, Any]:
    """``gen_seqs`` concurrent sequences of ``gen_prompt`` tokens: prefill tok/s from the
    1-token run, generation tok/s from the ``gen_tokens`` run's own decode span."""
    p = bench.profile
    bench.warm(p.gen_seqs, p.gen_prompt)
    t1, _ = bench.generate(bench.prompts.batch(p.gen_seqs, p.gen_prompt), greedy(1))
    tn, outs = bench.generate(bench.prompts.batch(p.gen_seqs, p.gen_prompt),
                              greedy(p.gen_tokens))
    prefill = p.gen_seqs * p.gen_prompt / t1
    gen = p.gen_seqs * (p.gen_tokens - 1) / decode_seconds(outs)
    log.info("gen %d seqs: prefill %.0f tok/s, generation %.0f tok/s", p.gen_seqs, prefill, gen)
    return {"seqs": p.gen_seqs, "prompt": p.gen_prompt, "tokens": p.gen_tokens,
            "prefill_s": t1, "total_s": tn, "prefill_tok_s": prefill, "gen_tok_s": gen,
            "vs_llama_cpp_prefill": prefill / LLAMA_CPP_PREFILL_TOK_S,
            "vs_llama_cpp_gen": gen / LLAMA_CPP_GEN_TOK_S}


def new_scheduler(llm, cache: dict | None = None, scheduler: dict | None = None) -> None:
    """A new scheduler (fresh block pool) over the runner's current plan, with the given
    fields of the cache and scheduler configs replaced; engine idle."""
    from edge_llm.engine.scheduler import Scheduler

    engine = llm.engine
    if engine.has_unfinished():
        raise RuntimeError("a new scheduler needs an idle engine")
    engine.config = replace(engine.config, cache=replace(engine.config.cache, **(cache or {})),
                            scheduler=replace(engine.config.scheduler, **(scheduler or {})))
    plan = engine.runner.plan
    engine.scheduler = Scheduler(engine.config.scheduler, engine.config.cache,
                                 plan.num_gpu_blocks, plan.num_cpu_blocks)


def set_prefix_caching(llm, on: bool) -> None:
    """A new scheduler with the prefix cache on or off; engine idle."""
    new_scheduler(llm, cache={"enable_prefix_caching": on})


def graph_replay_ms(graphs, size: int, replays: int = 20) -> float | None:
    """Median device time of one replay of the prefill graph of ``size`` rows, back to back
    on its last inputs (it rewrites the K/V it wrote, with the same values): the forward's
    share of a first token that replayed it, without the host's. None without that graph."""
    graph = graphs.graphs.get(size) if graphs is not None else None
    if graph is None:
        return None
    import torch

    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def scenario_prefix(bench: EngineBench) -> dict[str, Any]:
    """Time to first token of (shared system prompt + fresh user turn) with the prefix cache
    on (system prompt cached by an earlier request) and off; the ratio off / on. On CUDA also
    the device time of the prefill graph the cached requests replayed (``graph_replay_ms``):
    what of the first token is the forward, and what is host work and sampling."""
    p = bench.profile
    system = bench.prompts.ids(p.prefix_system)

    paths = bench.llm.engine.runner.step_paths  # forwards by path (runner.py)
    graphs = bench.llm.engine.runner.prefill_graphs  # None: no prefill graphs (CPU, eager)

    def trials() -> tuple[list[float], list[int], dict[str, int]]:
        times, cached = [], []
        before = dict(paths)
        for _ in range(p.prefix_trials):
            t, outs = bench.generate([system + bench.prompts.ids(p.prefix_user)], greedy(1))
            times.append(t)
            cached.append(outs[0].num_cached_tokens)
        return times, cached, {k: v - before.get(k, 0) for k, v in paths.items()
                               if v > before.get(k, 0)}

    try:
        set_prefix_caching(bench.llm, True)
        bench.generate([system + bench.prompts.ids(p.prefix_user)], greedy(1))  # fills it
        replayed = dict(graphs.replays) if graphs is not None else {}
        on_times, on_cached, on_paths = trials()
        now = dict(graphs.replays) if graphs is not None else {}
        sizes = [t for t, n in now.items() if n > replayed.get(t, 0)]  # the buckets replayed
        forward_ms = graph_replay_ms(graphs, sizes[0]) if len(sizes) == 1 else None
        set_prefix_caching(bench.llm, False)
        off_times, off_cached, off_paths = trials()
    finally:
        set_prefix_caching(bench.llm, True)
    if any(off_cached) or not all(on_cached):
        raise RuntimeError(f"cached tokens: on {on_cached}, off {off_cached}")
    on, off = statistics.median(on_times), statistics.median(off_times)
    log.info("prefix: TTFT %.2f ms on (its graph's replay %s ms), %.1f ms off (x%.1f); "
             "forwards on %s, off %s", on * 1e3,
             "-" if forward_ms is None else f"{forward_ms:.2f}", off * 1e3, off / on, on_paths,
             off_paths)
    return {"system_tokens": p.prefix_system, "user_tokens": p.prefix_user,
            "ttft_on_ms": [t * 1e3 for t in on_times], "ttft_off_ms": [t * 1e3 for t in off_times],
            "cached_tokens_on": on_cached, "ttft_ratio_off_on": off / on,
            "forward_steps_on": on_paths, "forward_steps_off": off_paths,
            "graph_replay_ms_on": forward_ms}


def device_weight_bytes(model) -> int:
    """Bytes of every distinct parameter and buffer of the model (what its weights occupy)."""
    seen, total = set(), 0
    for _, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t is not None and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def resize_kv_cache(llm, kv_bytes: int) -> None:
    """Free the KV tensors, plan ``kv_bytes`` of KV cache, allocate it, new scheduler."""
    from edge_llm.engine.kv_cache import KVCache, plan_kv_cache

    engine, runner = llm.engine, llm.engine.runner
    if engine.has_unfinished():
        raise RuntimeError("resize_kv_cache needs an idle engine")
    runner._drop_graphs()
    runner.kv = None
    free_device_memory(str(runner.device))
    cache = replace(engine.config.cache, kv_cache_memory=kv_bytes)
    runner.plan = plan_kv_cache(engine.loaded.arch, cache, runner.kv_dtype, runner.device,
                                engine.max_model_len, 0)
    runner.cache_config = cache
    runner.kv = KVCache(engine.loaded.arch, runner.plan, runner.block_size, runner.kv_dtype,
                        runner.device)
    runner._capture_graphs()
    new_scheduler(llm, cache={"kv_cache_memory": kv_bytes})


def scenario_card(bench: EngineBench) -> dict[str, Any]:
    """A 24 GB card: KV budget = card - (weights + the largest batch's activations, measured
    as the engine does at start) - the CUDA graphs' memory (the engine's start-up estimate)
    - the engine's serving slack - this process's memory outside the allocator (CUDA
    context, library workspaces): the engine's own plan for the whole card.
    Reports how many ``card_seq_len`` sequences fit, runs that many at once, and checks the
    peak of the allocator's reserved memory (graph pools included) plus the context against
    the card."""
    import torch

    p, runner = bench.profile, bench.engine.runner
    cuda = bench.device.startswith("cuda")
    weights = device_weight_bytes(runner.model)
    runner._drop_graphs()  # before its KV tensors go
    runner.kv = None
    free_device_memory(bench.device)
    if cuda:
        # private on purpose: the engine's own measurement of weights + activations
        other = runner.measure_peak_memory()
        free, total = torch.cuda.mem_get_info()
        context = (total - free) - torch.cuda.memory_reserved()
    else:
        other, context = weights, 0
    from edge_llm.engine.kv_cache import SERVING_SLACK_BYTES

    # the engine measures it at start only for a fraction-of-the-card budget
    graphs = runner.graph_memory_estimate or runner.measure_graph_memory()
    slack = SERVING_SLACK_BYTES if cuda else 0  # the engine's plan has it on CUDA only
    budget = p.card_bytes - other - graphs - slack - context
    if budget <= 0:
        raise RuntimeError(f"weights + activations ({other / 1e9:.2f} GB) + CUDA graphs "
                           f"({graphs / 1e9:.2f} GB) + slack ({slack / 1e9:.2f} GB) + "
                           f"context ({context / 1e9:.2f} GB) leave no KV room on a "
                           f"{p.card_bytes / 1e9:.2f} GB card")
    resize_kv_cache(bench.llm, budget)
    plan = runner.plan
    kv = plan.num_gpu_blocks * plan.block_bytes
    per_seq = -(-p.card_seq_len // runner.block_size)
    fit = plan.num_gpu_blocks // per_seq
    if fit < 1:
        raise RuntimeError(f"no {p.card_seq_len}-token sequence fits in {budget} bytes of KV")
    held = runner.graph_stats.memory_bytes + runner.prefill_graph_stats.memory_bytes
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = bench.preemptions()
    prompt_len = p.card_seq_len - p.card_tokens
    ran = min(fit, p.card_run_max or fit)
    seconds, _ = bench.generate(bench.prompts.batch(ran, prompt_len), greedy(p.card_tokens))
    # reserved, not allocated: a graph pool's blocks count as allocated only during capture
    peak = torch.cuda.max_memory_reserved() if cuda else None
    peak_allocated = torch.cuda.max_memory_allocated() if cuda else None
    res = {
        "card_bytes": p.card_bytes, "weights_bytes": weights, "activation_and_weights_bytes": other,
        "context_bytes": context, "graph_estimate_bytes": graphs, "graph_bytes": held,
        "kv_bytes": kv, "weights_plus_kv_bytes": weights + kv,
        "weights_plus_kv_ok": weights + kv <= p.card_bytes, "seq_len": p.card_seq_len,
        "seqs_fit": fit, "ran_seqs": ran, "seconds": seconds,
        "preemptions": bench.preemptions() - before,
        "peak_reserved_bytes": peak, "peak_allocated_bytes": peak_allocated,
        "peak_plus_context_ok": None if peak is None else peak + context <= p.card_bytes,
    }
    log.info("24 GB card: %d sequences of %d tokens fit; weights + KV %.2f GB; peak %s",
             fit, p.card_seq_len, (weights + kv) / 1e9,
             "n/a" if peak is None else f"{(peak + context) / 1e9:.2f} GB with context")
    return res
