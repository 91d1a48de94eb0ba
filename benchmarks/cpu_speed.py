"""How fast is the demo on my CPU?

    python benchmarks/cpu_speed.py [--runs 5] [--model DIR] [--compare-fp32]

Loads the demo (or ``--model``) on the CPU, as ``LLM()`` does (the engine caps torch's threads at
the CPUs this process may use: edge_llm/engine/cpu_threads.py), and prints the median of
``--runs`` timed runs of

- generation at batch 1 and at 8 sequences, tokens/s of the decode steps only:
  ``(T(1 + n tokens) - T(1 token)) / n`` on the same fresh prompts (llama.cpp's ``tg``),
- prompt processing of one fresh 128-token prompt, tokens/s (llama.cpp's ``pp``),

with the torch threads, the CPUs available and the load average. Every run uses new random
prompts and prefix caching is off, so nothing is served from the cache. ``--compare-fp32``
also loads the model with ``dtype="float32"`` (the exact reference path: fp32 weights
dequantized once at the first call) and alternates its runs with the default's, so a busy
machine slows both alike. CPU time (all threads) is printed beside wall time: on a shared
machine it is the steadier figure.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from edge_llm import LLM, SamplingParams  # before torch: OMP_WAIT_POLICY (edge_llm/__init__.py)
from edge_llm.engine.cpu_threads import available_cpus

PROMPT_TOKENS = 128  # prompt processing
GEN_PROMPT_TOKENS = 16  # the short prompts of the generation runs
GEN_TOKENS = 32


class Timer:
    """Wall and process CPU seconds of the block."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def _prompts(rng: random.Random, vocab: int, count: int, length: int) -> list[dict]:
    return [{"prompt_token_ids": [rng.randrange(100, vocab) for _ in range(length)]}
            for _ in range(count)]


def _run(llm: LLM, prompts: list[dict], tokens: int) -> Timer:
    sp = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    with Timer() as t:
        outs = llm.generate(prompts, sp, use_tqdm=False)
    if any(len(o.outputs[0].token_ids) != tokens for o in outs):
        raise RuntimeError("a request stopped early")
    return t


def measure(llm: LLM, rng: random.Random, vocab: int) -> dict[str, tuple[float, float]]:
    """One run of each figure: {name: (wall tokens/s, CPU-time tokens/s)}."""
    out = {}
    for batch in (1, 8):
        prompts = _prompts(rng, vocab, batch, GEN_PROMPT_TOKENS)
        one = _run(llm, prompts, 1)
        many = _run(llm, _prompts(rng, vocab, batch, GEN_PROMPT_TOKENS), 1 + GEN_TOKENS)
        n = batch * GEN_TOKENS
        out[f"generation, batch {batch}"] = (n / max(many.wall - one.wall, 1e-9),
                                             n / max(many.cpu - one.cpu, 1e-9))
    pp = _run(llm, _prompts(rng, vocab, 1, PROMPT_TOKENS), 1)
    out[f"prompt processing, {PROMPT_TOKENS} tokens"] = (PROMPT_TOKENS / pp.wall,
                                                        PROMPT_TOKENS / pp.cpu)
    return out


def _load(model: str | None, dtype: str) -> LLM:
    llm = LLM(model, device="cpu", dtype=dtype, max_model_len=512, enable_prefix_caching=False)
    _run(llm, [{"prompt_token_ids": list(range(100, 100 + PROMPT_TOKENS))}], 4)  # warm-up
    return llm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the demo)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per figure (median)")
    ap.add_argument("--compare-fp32", action="store_true",
                    help="alternate with dtype float32 (the fp32 reference path)")
    args = ap.parse_args()
    import torch  # after edge_llm (see above)

    engines = {"default (auto)": _load(args.model, "auto")}
    if args.compare_fp32:
        engines["float32"] = _load(args.model, "float32")
    vocab = engines["default (auto)"].engine.loaded.arch.vocab_size
    rng = random.Random(0)
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    for _ in range(args.runs):
        for name, llm in engines.items():  # alternated: the machine's load hits both alike
            runs[name].append(measure(llm, rng, vocab))
    load_after = os.getloadavg()
    print(f"torch threads {torch.get_num_threads()}, CPUs available "
          f"{available_cpus()}, load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after; median of {args.runs} runs")
    for name, results in runs.items():
        llm = engines[name]
        print(f"\n{name}: dtype {llm.engine.loaded.dtype}")
        for figure in results[0]:
            wall = statistics.median(r[figure][0] for r in results)
            cpu = statistics.median(r[figure][1] for r in results)
            print(f"  {figure:<34} {wall:8.1f} tok/s   ({cpu:8.1f} tok/s of CPU time)")


if __name__ == "__main__":
    main()
