"""The host work of one decode step at large batches, by part, on the CPU (no GPU needed).

    python benchmarks/host_overhead.py [--rows 64,160,256] [--prompt 800] [--steps 20]

Why: a 160-row decode step of Llama-2-7B on the H200 spent 7.7 of its 33.2 ms outside any
kernel (BENCHMARKS.md, session 16, call 6), while the GPU waited. This runs the real engine
on the demo model with the model itself left out: the runner's ``execute`` is replaced by a
stand-in that returns a fixed token per sampled row, so prefill costs nothing. Every other
part of a decode step runs as the engine runs it:

    schedule       Scheduler.schedule
    inputs         cuda_graphs.decode_inputs (the host tensors a graph replay copies in)
    sample         the runner's _sample (greedy) on logits 64 wide: its host work only (the
                   argmax over the vocabulary runs on the GPU there, and the host waits
                   for the step's kernels at its tolist())
    update         Scheduler.update_from_output
    outputs        LLMEngine._postprocess (detokenizing, RequestOutput objects): requests
                   as the server adds them ("stream": an output every step) and as
                   LLM.generate adds them ("final": outputs only when a request finishes)

Prints one table: milliseconds per step for each part, at each row count and output mode.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _fixed_execute(sched):
    from edge_llm.engine.runner import RunnerOutput

    out = RunnerOutput()
    for s in sched.scheduled:
        if s.do_sample:
            out.sampled[s.seq.seq_id] = 100 + s.seq.seq_id % 300
    return out


def measure(llm, rows: int, prompt: int, steps: int, final_only: bool) -> dict[str, float]:
    from edge_llm import SamplingParams
    from edge_llm.engine import cuda_graphs
    from edge_llm.engine.runner import PendingStep, RunnerOutput

    eng = llm.engine
    real_execute = eng.runner.execute
    eng.runner.execute = _fixed_execute
    try:
        params = SamplingParams(temperature=0.0, max_tokens=steps + 8 + rows * prompt // 2048,
                                ignore_eos=True)
        for i in range(rows):
            eng.add_request(f"h{rows}-{final_only}-{i}", {"prompt_token_ids": [
                3 + (i * 31 + j * 7) % 4000 for j in range(prompt)]}, params,
                final_only=final_only)
        for _ in range(10 * rows):
            if len(eng.scheduler.running) == rows and all(
                    s.output_token_ids for s in eng.scheduler.running):
                break
            eng.step()
        else:
            raise SystemExit(f"error: {len(eng.scheduler.running)} of {rows} rows running "
                             f"after prefill (KV cache too small?)")
        logits = torch.randn(rows, 64)
        parts = dict.fromkeys(("schedule", "inputs", "sample", "update", "outputs"), 0.0)
        pad = cuda_graphs.padded_size(cuda_graphs.capture_sizes(256), rows) or rows
        for _ in range(steps):
            t0 = time.perf_counter()
            sched = eng.scheduler.schedule()
            t1 = time.perf_counter()
            cuda_graphs.decode_inputs(sched.scheduled, pad, eng.runner.block_size)
            t2 = time.perf_counter()
            pending = PendingStep(RunnerOutput())
            eng.runner._sample(logits[: len(sched.scheduled)],
                               [s for s in sched.scheduled if s.do_sample], pending)
            out = pending.collect()
            t3 = time.perf_counter()
            seqs = eng.scheduler.update_from_output(sched, out.sampled)
            t4 = time.perf_counter()
            eng._postprocess(sched, seqs, out)
            t5 = time.perf_counter()
            if len(sched.scheduled) != rows:
                raise SystemExit(f"error: a step of {len(sched.scheduled)} rows, not {rows}")
            for k, a, b in (("schedule", t0, t1), ("inputs", t1, t2), ("sample", t2, t3),
                            ("update", t3, t4), ("outputs", t4, t5)):
                parts[k] += (b - a) * 1e3 / steps
        for rid in list(eng.requests):
            eng.abort(rid)
        return parts
    finally:
        eng.runner.execute = real_execute


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="64,160,256")
    ap.add_argument("--prompt", type=int, default=800)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--freeze-gc", action="store_true",
                    help="gc.collect() + gc.freeze() once the engine is built, as `edge-llm "
                         "serve` does when ready")
    a = ap.parse_args()
    from edge_llm import LLM

    row_counts = [int(r) for r in a.rows.split(",")]
    max_len = a.prompt + 512
    # an fp8 cache: a quarter of the demo model's fp32 bytes (11.5 KB a token), room for
    # every row at full length
    llm = LLM(max_model_len=max_len, enforce_eager=True, max_num_seqs=max(row_counts),
              growth_reserve=0, enable_prefix_caching=False, kv_cache_dtype="fp8",
              kv_cache_memory=max(row_counts) * max_len * 12 * 1024, swap_space=0.0)
    if a.freeze_gc:
        gc.collect()
        gc.freeze()
    names = ("schedule", "inputs", "sample", "update", "outputs")
    print(f"host ms per decode step ({a.prompt}-token prompts; torch threads "
          f"{torch.get_num_threads()}; start-up objects frozen: {a.freeze_gc})")
    print("rows | outputs | " + " | ".join(names) + " | total")
    for rows in row_counts:
        for final_only in (False, True):
            parts = measure(llm, rows, a.prompt, a.steps, final_only)
            print(f"{rows} | {'final' if final_only else 'stream'} | "
                  + " | ".join(f"{parts[k]:.2f}" for k in names)
                  + f" | {sum(parts.values()):.2f}", flush=True)
    if a.freeze_gc:
        gc.unfreeze()  # collectable at exit (nanobind reports frozen objects as leaks)


if __name__ == "__main__":
    main()
