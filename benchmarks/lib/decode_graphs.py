"""``kernels_bench.py graphs``: decode speed with CUDA graphs against eager
(``--enforce-eager``), batch 1, 4 and 16, on a random-weight Llama-2-7B-shape AWQ checkpoint
(benchmarks/random_checkpoint.py). One table.

    python benchmarks/kernels_bench.py graphs [--ckpt /tmp/ckpt-llama2-7b-awq] [--out graphs.json]
    python benchmarks/kernels_bench.py graphs --graphs-only --variant NAME [--rounds 2]

``--variant NAME``: a 1-2 row W4A16 launch variant of the sweep (``w4a16_variants``, its name,
e.g. "g16 p4 fused"; ``--variant best:SWEEP_JSON`` takes the best geometric mean at one row
from a sweep's JSON; ``--variant per-shape:SWEEP_JSON`` each problem's best in that sweep, the
dispatched choice where it won) runs against the dispatched choice, interleaved ``--rounds``
times (graphs only): the engine with the table's ``lookup`` patched at M <= 2, nothing else
changed. The kernel sweep times each launch alone and without PDL; only this tells what a
candidate does in a decode step (the per-shape winners of one sweep: 0.914x at batch 1).

Each mode runs in its own process. Decode rate at batch B: the same B prompts (128 tokens)
generated to N1 and to N2 tokens, rate = B * (N2 - N1) / (t(N2) - t(N1)), so prefill and
start-up cancel; the best of ``--reps`` timings of each. Report the ratios (graphs / eager):
absolute rates are the H200's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from edge_llm import envs

KERNELS_BENCH = Path(__file__).resolve().parents[1] / "kernels_bench.py"
BATCHES = (1, 4, 16)


def best_variant(sweep_json: Path, m: int = 1) -> str:
    """The variant with the best geometric-mean speed-up over cuBLAS at ``m`` rows (every
    shape measured, relative error under 1e-2), "auto" excluded."""
    import math

    rows = [r for r in json.loads(sweep_json.read_text())["rows"] if r["m"] == m]
    names = {v for r in rows for v in r["res"] if v != "auto"}
    scores = {}
    for v in names:
        vals = [r["res"][v] for r in rows if v in r["res"] and r["res"][v]["err"] < 1e-2]
        if len(vals) == len(rows):
            scores[v] = sum(math.log(x["speedup"]) for x in vals) / len(vals)
    if not scores:
        raise SystemExit(f"{sweep_json}: no variant measured on every shape at M={m}")
    return max(scores, key=scores.get)


def worker(ckpt: str, mode: str, n1: int, n2: int, reps: int) -> dict:
    import torch

    from edge_llm import LLM, SamplingParams

    if mode.startswith("graphs:"):
        from .w4a16_variants import best_per_shape, patch_gemv

        name = mode.split(":", 1)[1]
        patch_gemv(best_per_shape(json.loads(Path(name[10:]).read_text())["rows"])
                   if name.startswith("per-shape:") else name)

    llm = LLM(ckpt, device="cuda", dtype="float16", max_model_len=1024, max_num_seqs=16,
              max_num_batched_tokens=2048, kv_cache_memory=4 << 30, swap_space=0.0,
              enable_prefix_caching=False, enforce_eager=mode == "eager")

    def timed(prompts, n: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    rates = {}
    for b in BATCHES:
        prompts = [{"prompt_token_ids": [1] + [(131 * i + 17 * j) % 31000 + 3 for j in range(127)]}
                   for i in range(b)]
        timed(prompts, n1)  # warm: kernels compiled, allocator settled
        short = min(timed(prompts, n1) for _ in range(reps))
        long = min(timed(prompts, n2) for _ in range(reps))
        rates[b] = b * (n2 - n1) / (long - short) if long > short else float("nan")
    st = llm.engine.stats()
    return {"mode": mode, "tok_s": rates, "graphs": st["num_cuda_graphs"],
            "capture_s": st["cuda_graph_capture_seconds"],
            "capture_mib": st["cuda_graph_memory_bytes"] / (1 << 20)}


def run(ckpt: Path, mode: str, n1: int, n2: int, reps: int) -> dict:
    env = envs.child_environ({envs.OMP_WAIT_POLICY: "PASSIVE"})
    cmd = [sys.executable, str(KERNELS_BENCH), "graphs", "--worker", str(ckpt), mode, str(n1),
           str(n2), str(reps)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{mode} worker failed:\n{res.stderr[-3000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["tok_s"] = {int(k): v for k, v in out["tok_s"].items()}
    return out


def compare_variant(a, name: str) -> None:
    """The dispatched choice and ``name`` in alternating processes; one table of rates."""
    if name.startswith("per-shape:"):
        from .w4a16_variants import best_per_shape

        for (m, n, k), v in sorted(best_per_shape(
                json.loads(Path(name[10:]).read_text())["rows"]).items()):
            print(f"M={m} N={n} K={k}: {v}")
    runs = []
    for _ in range(a.rounds):
        for mode in ("graphs", f"graphs:{name}"):
            runs.append(run(a.ckpt, mode, a.n1, a.n2, a.reps))
    print(f"decode tokens/s with graphs, dispatched vs {name!r} at 1-2 rows, interleaved")
    print(f"{'batch':>5} | " + " | ".join(f"{'auto' if r['mode'] == 'graphs' else 'variant':>9}"
                                          for r in runs) + " | variant/auto (mean)")
    for b in BATCHES:
        auto = [r["tok_s"][b] for r in runs if r["mode"] == "graphs"]
        var = [r["tok_s"][b] for r in runs if r["mode"] != "graphs"]
        cells = " | ".join(f"{r['tok_s'][b]:>9.1f}" for r in runs)
        print(f"{b:>5} | {cells} | {sum(var) / len(var) / (sum(auto) / len(auto)):.3f}")
    if a.out:
        a.out.write_text(json.dumps({"variant": name, "runs": runs}, indent=1))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[2:] if argv is None else argv
    if argv and argv[0] == "--worker":
        ckpt, mode, n1, n2, reps = argv[1], argv[2], *map(int, argv[3:6])
        print(json.dumps(worker(ckpt, mode, n1, n2, reps)))
        return 0
    ap = argparse.ArgumentParser(prog="kernels_bench.py graphs",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", type=Path, default=Path("/tmp/ckpt-llama2-7b-awq"))
    ap.add_argument("--n1", type=int, default=16, help="tokens of the short run")
    ap.add_argument("--n2", type=int, default=80, help="tokens of the long run")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--graphs-only", action="store_true", help="skip the eager engine")
    ap.add_argument("--variant", help="a sweep variant name, best:SWEEP_JSON or "
                                      "per-shape:SWEEP_JSON")
    ap.add_argument("--rounds", type=int, default=2, help="--variant: interleaved rounds")
    a = ap.parse_args(argv)
    if a.n2 <= a.n1 or a.n1 < 1:
        ap.error("need 1 <= --n1 < --n2")
    if a.variant:
        name = (best_variant(Path(a.variant[5:])) if a.variant.startswith("best:")
                else a.variant)
        compare_variant(a, name)
        return 0
    if not (a.ckpt / "config.json").is_file():
        from random_checkpoint import make_random_checkpoint

        make_random_checkpoint("llama2-7b", "awq", a.ckpt, 128, "cuda")
    eager = None if a.graphs_only else run(a.ckpt, "eager", a.n1, a.n2, a.reps)
    graphs = run(a.ckpt, "graphs", a.n1, a.n2, a.reps)
    print(f"decode tokens/s, Llama-2-7B shape, random weights, {a.ckpt}")
    if eager is None:
        print(f"{'batch':>5} | {'graphs':>9}")
        for b in BATCHES:
            print(f"{b:>5} | {graphs['tok_s'][b]:>9.1f}")
    else:
        print(f"{'batch':>5} | {'eager':>9} | {'graphs':>9} | graphs/eager")
        for b in BATCHES:
            e, g = eager["tok_s"][b], graphs["tok_s"][b]
            print(f"{b:>5} | {e:>9.1f} | {g:>9.1f} | {g / e:.2f}x")
    print(f"capture: {graphs['graphs']} graphs in {graphs['capture_s']:.2f} s, "
          f"{graphs['capture_mib']:.0f} MiB")
    if a.out:
        a.out.write_text(json.dumps({"eager": eager, "graphs": graphs}, indent=1))
    return 0
