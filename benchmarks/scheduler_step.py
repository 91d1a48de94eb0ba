"""Scheduler + postprocess cost per decode step (pure Python, no model).

256 running sequences with 1,000-token prompts decode together; each step runs
``schedule()`` and ``update_from_output()`` with a precomputed ``sampled`` dict (the sampler's
cost is the runner's, not measured here). Prints one table: milliseconds per step.

    python benchmarks/scheduler_step.py [--seqs 256] [--prompt 1000] [--steps 300]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from edge_llm.config import CacheConfig, SchedulerConfig
from edge_llm.engine.scheduler import Scheduler
from edge_llm.sampling_params import SamplingParams


def build(num_seqs: int, prompt_len: int, steps: int, prefix_caching: bool) -> Scheduler:
    """A scheduler whose ``num_seqs`` sequences finished their prefill and now decode."""
    bs = 16
    max_len = prompt_len + steps + 64
    blocks_per_seq = -(-max_len // bs)
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=num_seqs, max_num_batched_tokens=8192, max_model_len=max_len),
        CacheConfig(block_size=bs, enable_prefix_caching=prefix_caching),
        num_gpu_blocks=num_seqs * blocks_per_seq + 8,
        num_cpu_blocks=0,
    )
    rng = random.Random(0)
    for i in range(num_seqs):
        prompt = [rng.randrange(32000) for _ in range(prompt_len)]
        params = SamplingParams(max_tokens=steps + 32, ignore_eos=True)
        sched.add_request(f"req-{i}", prompt, params, arrival_time=float(i))
    while any(s.num_tokens - s.num_computed_tokens > 1 for s in sched.running) or sched.waiting:
        out = sched.schedule()
        sampled = {r.seq.seq_id: 7 for r in out.scheduled if r.do_sample}
        sched.update_from_output(out, sampled)
    return sched


def measure(sched: Scheduler, steps: int) -> tuple[list[float], list[float], list[float]]:
    """Wall milliseconds of schedule() and of update_from_output() for each decode step, and
    the CPU milliseconds of both (robust to other processes competing for the cores)."""
    sampled = {s.seq_id: 11 for s in sched.running}  # the runner's output, built beforehand
    t_sched, t_update, t_cpu = [], [], []
    clock, cpu = time.perf_counter, time.thread_time
    for _ in range(steps):
        c0 = cpu()
        t0 = clock()
        out = sched.schedule()
        t1 = clock()
        sched.update_from_output(out, sampled)
        t2 = clock()
        t_cpu.append((cpu() - c0) * 1e3)
        if len(out.scheduled) != len(sampled) or not all(r.do_sample for r in out.scheduled):
            raise RuntimeError("the benchmark left the steady decode state")
        t_sched.append((t1 - t0) * 1e3)
        t_update.append((t2 - t1) * 1e3)
    return t_sched, t_update, t_cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    print(f"{args.seqs} sequences x {args.prompt}-token prompts, {args.steps} decode steps")
    print(f"{'prefix cache':<13} {'phase':<20} {'mean ms':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for caching in (True, False):
        sched = build(args.seqs, args.prompt, args.steps, caching)
        t_sched, t_update, t_cpu = measure(sched, args.steps)
        total = [a + b for a, b in zip(t_sched, t_update, strict=True)]
        rows = [("schedule", t_sched), ("update_from_output", t_update), ("total", total)]
        for name, xs in [*rows, ("total, CPU time", t_cpu)]:
            xs = sorted(xs)
            p99 = xs[min(len(xs) - 1, int(0.99 * len(xs)))]
            print(
                f"{'on' if caching else 'off':<13} {name:<20} {statistics.fmean(xs):>8.3f} "
                f"{statistics.median(xs):>8.3f} {p99:>8.3f}"
            )
        sched.check_integrity()


if __name__ == "__main__":
    main()
