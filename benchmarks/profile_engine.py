"""Where the time goes: engine construction and eager steps under cProfile (GPU or CPU).

    python benchmarks/profile_engine.py --out DIR [--shape llama2-7b] [--top 30]

Builds (or reuses) a random-weight AWQ checkpoint of the shape, then profiles
1. ``LLM(...)`` construction (weights, tokenizer, memory profile, KV cache, CUDA graphs),
   cumulative time per function;
2. prefill of a 1,000-token prompt (eager), the same with all but its last 24 tokens
   cached (the e2e prefix scenario's first token: cumulative and own time, then device time
   by kernel under torch.profiler), and 32 decode steps, own time per function.
Writes profile_engine.txt under --out and prints the top lines of each.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def _stats(prof: cProfile.Profile, key: str, top: int) -> str:
    buf = io.StringIO()
    # import machinery frames are left out: they only repeat the modules' own cumulative time
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(
        r"^(?!<frozen)", top)
    return buf.getvalue()


def _kernel_table(llm, prefix: list[int], one, n: int, top: int) -> str:
    """The cached first token under torch.profiler: device time by kernel (CPU time by op
    without a GPU), 5 requests."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for i in range(5):
            llm.generate({"prompt_token_ids": prefix + [100 + i + j for j in range(24)]}, one,
                         use_tqdm=False)
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    return (f"5 x {n - 24} cached + 24 new tokens under torch.profiler, by {key}:\n"
            + prof.key_averages().table(sort_by=key, row_limit=top, max_name_column_width=60))


def _context(ckpt: Path) -> int:
    import json

    return int(json.loads((ckpt / "config.json").read_text())["max_position_embeddings"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="llama2-7b")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--device", default=None)
    args = ap.parse_args()
    from e2e_common import DEFAULT_CKPT_DIR, ensure_checkpoint

    ckpt = ensure_checkpoint(args.shape, "awq", DEFAULT_CKPT_DIR, args.device)
    t0 = time.perf_counter()
    import torch

    from edge_llm import LLM, SamplingParams
    t_import = time.perf_counter() - t0
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    report = [f"import edge_llm + torch: {t_import:.2f} s"]
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    llm = LLM(str(ckpt), device=dev, max_model_len=min(2048, _context(ckpt)))
    prof.disable()
    report.append(f"LLM construction: {time.perf_counter() - t0:.2f} s")
    report.append(_stats(prof, "cumulative", args.top))
    vocab = llm.engine.loaded.arch.vocab_size
    n = min(1000, llm.engine.max_model_len - 40)
    prompt = {"prompt_token_ids": [(7 * i) % (vocab - 10) + 5 for i in range(n)]}
    one = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
    llm.generate(prompt, one, use_tqdm=False)  # warm
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for i in range(3):
        p = {"prompt_token_ids": [(11 * j + i) % (vocab - 10) + 5 for j in range(n)]}
        llm.generate(p, one, use_tqdm=False)
    prof.disable()
    report.append(f"3 x prefill {n} tokens (1 output token): "
                  f"{(time.perf_counter() - t0) / 3 * 1e3:.1f} ms each")
    report.append(_stats(prof, "tottime", args.top))
    # the e2e prefix scenario's cached case: the same prompt's first n - 24 tokens cached
    prefix = [(13 * j) % (vocab - 10) + 5 for j in range(n - 24)]
    llm.generate({"prompt_token_ids": prefix + [5] * 24}, one, use_tqdm=False)  # caches it
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for i in range(10):
        outs = llm.generate({"prompt_token_ids": prefix + [6 + i + j for j in range(24)]}, one,
                            use_tqdm=False)
    prof.disable()
    report.append(f"10 x {n - 24} cached + 24 new tokens (1 output token, "
                  f"{outs[0].num_cached_tokens} cached): "
                  f"{(time.perf_counter() - t0) / 10 * 1e3:.2f} ms each; "
                  f"forwards by path {dict(llm.engine.runner.step_paths)}")
    report.append(_stats(prof, "cumulative", args.top))
    report.append(_stats(prof, "tottime", args.top))
    report.append(_kernel_table(llm, prefix, one, n, args.top))
    dec = SamplingParams(max_tokens=33, ignore_eos=True, temperature=0.0)
    llm.generate({"prompt_token_ids": [5, 6, 7, 8]}, dec, use_tqdm=False)  # warm
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    llm.generate({"prompt_token_ids": [9, 10, 11, 12]}, dec, use_tqdm=False)
    prof.disable()
    report.append(f"1 prompt + 32 decode steps: {(time.perf_counter() - t0) * 1e3:.1f} ms")
    report.append(_stats(prof, "tottime", args.top))
    text = "\n".join(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile_engine.txt").write_text(text)
    print(text[:20000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
