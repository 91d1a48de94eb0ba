"""``kernels_bench.py profile``: where a decode step's GPU time goes: CUDA kernel time per
step, by kernel, at several batch sizes, against the step time of CUDA-graph replay (GPU only).

    python benchmarks/kernels_bench.py profile --out DIR [--ckpt /tmp/ckpt-llama2-7b-awq]
        [--batches 1,16,64] [--prompt 128] [--steps 16]

For each batch B (B prompts of ``--prompt`` tokens): an eager engine (``enforce_eager``)
prefills them all, then runs ``steps`` decode steps of B rows under ``torch.profiler``: the
kernel tally per step, and at batch 1 the one-row GEMV's time per linear of a layer (qkv, o,
gate_up, down) as a fraction of the copy bandwidth measured in the run. A second engine with
CUDA graphs times ``steps`` such steps by the wall clock (host work included). The gap between
the two is what the GPU does not spend in kernels during a replayed step (launch gaps, host
work, host waits). Prints one table per batch, writes profile_kernels.json under --out.

That gap is then taken apart on the graph engine: the same kernel tally with CUDA graphs
(kernels replayed inside a graph can run differently from eager launches: the decode attention
grid is sized for ``--max-model-len`` there), what each replayed kernel adds to the step
(``critical_path``: with programmatic dependent launch a kernel starts inside its
predecessor, so its own duration counts time the step spent on the one before; the added
times sum to the step's GPU time) and the host work of each phase of
``LLMEngine.step`` (``host_phases``): scheduling, the runner's launch work (graph inputs,
replay, sampler launch), the wait for the GPU, the scheduler update, output processing, with
the outputs built before the next launch and while the next step runs (async output processing,
the GPU default). Host work outside the wait is time the GPU idles, except the outputs in the
async mode.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path


def _short(name: str) -> str:
    """Kernel names without template arguments and launch decorations."""
    name = re.sub(r"<.*>", "", name)
    name = re.sub(r"\(.*\)", "", name)
    return name.strip()[:48] or "?"


GEMV = "_w4a16_gemv16_kernel"
# the W4A16 linears of a decoder layer in launch order, where q/k/v and gate/up are merged
LAYER_LINEARS = ("qkv", "o", "gate_up", "down")


def kernel_spans(fn) -> list[tuple[str, float, float]]:
    """(kernel, start, end) in microseconds of each CUDA kernel (and copy) ``fn()`` runs, in
    the order they started."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    return [(_short(e.name), float(e.time_range.start), float(e.time_range.end))
            for e in events]


def critical_path(spans: list[tuple[str, float, float]]) -> tuple[list[tuple[str, float]],
                                                                   float]:
    """What each kernel of one stream adds to its time: (kernel, microseconds) in order, and
    the microseconds the stream had nothing running (the host's gaps).

    A kernel's share is its end less the latest end before it, from its own start where it
    started after that (the gap before it is idle time). Under programmatic dependent launch a
    kernel starts inside its predecessor and waits for it, so its own duration counts the
    predecessor's tail too, and the durations of a replayed step add up to more than the
    step; these shares add up to exactly the span from the first start to the last end, each
    kernel charged only with the time the stream waited for it after everything before it
    was done."""
    shares, idle = [], 0.0
    done = spans[0][1] if spans else 0.0  # the first kernel's start: no idle before it
    for name, start, end in spans:
        idle += max(0.0, start - done)
        shares.append((name, max(0.0, end - max(done, start))))
        done = max(done, end)
    return shares, idle


def kernel_tally(launches: list[tuple[str, float]]) -> dict[str, list[float]]:
    """{kernel: [count, microseconds]} of a list of (kernel, microseconds) in launch order."""
    tally: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, us in launches:
        tally[name][0] += 1
        tally[name][1] += us
    return dict(tally)


def by_layer_position(us: list[float], layers: int, steps: int) -> list[float] | None:
    """Mean microseconds of a kernel per position within a decoder layer: its launches over
    ``steps`` forwards of ``layers`` layers, taken in order (the i-th launch of a layer is
    position i). None when the launches do not divide evenly into layers."""
    per_layer, rest = divmod(len(us), steps * layers)
    if rest or not per_layer:
        return None
    return [sum(us[p::per_layer]) / (steps * layers) for p in range(per_layer)]


def layer_linear_bytes(arch, group_size: int) -> list[int]:
    """Bytes a one-row W4A16 matmul must read per linear of ``LAYER_LINEARS`` (4-bit words,
    fp16 scales and zero points per group of ``group_size``)."""
    h, i = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    shapes = ((h, q + 2 * kv), (q, h), (h, 2 * i), (i, h))  # (K, N)
    return [k * n // 2 + 2 * 2 * (k // group_size) * n for k, n in shapes]


def gemv_table(per_position: list[float], nbytes: list[int] | None, copy_gbs: float) -> str:
    """The one-row GEMV's time per linear of a layer, and its fraction of copy bandwidth."""
    lines = ["W4A16 GEMV by its place in the layer (us per launch, fraction of copy bandwidth):"]
    names = LAYER_LINEARS if len(per_position) == len(LAYER_LINEARS) else None
    for p, us in enumerate(per_position):
        frac = (f" {nbytes[p] / (us * 1e-6) / (copy_gbs * 1e9):.2f}"
                if names and nbytes else "")
        lines.append(f"  {names[p] if names else p}: {us:.2f}{frac}")
    return "\n".join(lines)


def _prompts(batch: int, length: int) -> list[dict]:
    return [{"prompt_token_ids": [1] + [(131 * i + 17 * j) % 31000 + 3 for j in range(length - 1)]}
            for i in range(batch)]


def _engine(ckpt: Path, eager: bool, max_seqs: int, max_len: int, kv_gib: float,
            kv_dtype: str = "auto"):
    from edge_llm import LLM

    return LLM(str(ckpt), device="cuda", dtype="float16", max_model_len=max_len,
               kv_cache_dtype=kv_dtype,
               max_num_seqs=max_seqs, max_num_batched_tokens=max(2048, max_len),
               kv_cache_memory=int(kv_gib * (1 << 30)), swap_space=0.0, enable_prefix_caching=False,
               enforce_eager=eager, growth_reserve=0)  # the reserve held back part of the batch


def _kv_bytes_per_token(ckpt: Path) -> int:
    """fp16 K and V of every layer for one token (the engine's own block arithmetic)."""
    import torch

    from edge_llm.engine.kv_cache import bytes_per_block
    from edge_llm.model.arch import parse_arch_config

    arch = parse_arch_config(json.loads((ckpt / "config.json").read_text()))
    return bytes_per_block(arch, 1, torch.float16)


def _gemv_bytes(ckpt: Path) -> list[int] | None:
    """``layer_linear_bytes`` of the checkpoint's decoder layer (None: not grouped 4-bit)."""
    from edge_llm.model.arch import parse_arch_config

    cfg = json.loads((ckpt / "config.json").read_text())
    group = (cfg.get("quantization_config") or {}).get("group_size")
    if not isinstance(group, int) or group <= 0:
        return None
    return layer_linear_bytes(parse_arch_config(cfg), group)


def _new_tokens(batch: int, prompt: int, steps: int) -> int:
    """max_tokens per request: the first sequences decode while the later ones prefill (2,048
    tokens a step, the running decodes' included), and all must still be running for
    ``steps`` more."""
    return steps + 6 + -(-batch * prompt // max(2048 - batch, 256))


def _decode_phase(llm, batch: int, prompt: int, steps: int, tag: str):
    """Queue ``batch`` prompts on the engine and step until every one has its first token
    (all prefill done): the steps after that are decode steps of exactly ``batch`` rows, at
    least ``steps`` + 2 of them. Measuring those steps directly, not the difference of two
    generate() runs, keeps prefill out however the scheduler chunks it (a difference can hold
    a prefill step and come out negative)."""
    from edge_llm import SamplingParams

    eng = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=_new_tokens(batch, prompt, steps),
                            ignore_eos=True)
    for i, p in enumerate(_prompts(batch, prompt)):
        eng.add_request(f"{tag}-{i}", p, params)
    started: set[str] = set()
    while len(started) < batch:
        for out in eng.step():
            if out.outputs and out.outputs[0].token_ids:
                started.add(out.request_id)
    if len(eng.scheduler.running) != batch:  # some finished before the last started
        raise SystemExit(f"error: {len(eng.scheduler.running)} of {batch} sequences running "
                         f"after prefill; raise --kv-gib or --steps")
    return eng


def _finish(eng) -> None:
    while eng.has_unfinished():
        eng.step()


@dataclass
class StepKernels:
    """A decode step's kernels (``decode_kernels``): ``tally`` {kernel: [launches,
    microseconds]} per step, by their own durations; ``path`` the same by what each adds to
    the stream's time (``critical_path``), ``idle`` the microseconds a step the stream ran
    nothing; ``gemv`` / ``path_gemv`` the one-row GEMV's microseconds per launch by its place
    in the layer (``by_layer_position``), by either measure."""

    tally: dict[str, list[float]]
    gemv: list[float] | None
    path: dict[str, list[float]]
    path_gemv: list[float] | None
    idle: float


def decode_kernels(llm, batch: int, prompt: int, steps: int) -> StepKernels:
    """The kernels of a decode step of ``batch`` rows, over ``steps`` steps."""
    eng = _decode_phase(llm, batch, prompt, steps, "warm")  # compile and settle
    _finish(eng)
    eng = _decode_phase(llm, batch, prompt, steps, "tally")
    spans = kernel_spans(lambda: [eng.step() for _ in range(steps)])
    _finish(eng)
    layers = len(llm.engine.runner.model.model.layers)
    launches = [(name, end - start) for name, start, end in spans]
    shares, idle = critical_path(spans)

    def per_step(items: list[tuple[str, float]]) -> dict[str, list[float]]:
        return {name: [count / steps, us / steps]
                for name, (count, us) in kernel_tally(items).items()}

    return StepKernels(
        per_step(launches), by_layer_position([us for n, us in launches if n == GEMV], layers,
                                              steps),
        per_step(shares), by_layer_position([us for n, us in shares if n == GEMV], layers,
                                            steps),
        idle / steps)


def graph_step_us(llm, batch: int, prompt: int, steps: int, reps: int = 3) -> float:
    """Wall time of one decode step with CUDA graphs (host work included), best of reps."""
    import torch

    best = float("inf")
    for r in range(reps + 1):  # the first run warms up
        eng = _decode_phase(llm, batch, prompt, steps, f"graph{r}")
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
        if r:
            best = min(best, time.perf_counter() - start)
        _finish(eng)
    return best / steps * 1e6


def host_phases(llm, batch: int, prompt: int, steps: int) -> dict[str, float]:
    """Microseconds per decode step in each host phase of ``LLMEngine.step`` (graph engine,
    in its current output mode): schedule; launch (graph inputs, replay, sampler launch:
    ``runner.launch``, or ``launch_ahead`` with decode run-ahead); wait (the host waiting
    for the step's tokens: ``PendingStep.wait`` before ``collect()``, which would have
    waited anyway); collect (the rest of it); update (the scheduler); outputs (detokenizing,
    RequestOutputs); other. "critical": the host work the GPU waits for: all of it but the
    wait, less the outputs when they are built while the next step runs
    (``engine.async_output``). With run-ahead (``engine.run_ahead``) the next step is
    launched before the wait, so only host work beyond the GPU's step time would be
    critical; there "critical" is left at 0 and the step time says it."""
    import torch

    eng = _decode_phase(llm, batch, prompt, steps, "phases")
    t: dict[str, float] = defaultdict(float)

    def timed(obj, attr: str, key: str, wrap_result=None):
        fn = getattr(obj, attr)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
                return wrap_result(out) if wrap_result is not None else out
            finally:
                t[key] += time.perf_counter() - start
        setattr(obj, attr, wrapper)

    def waited(pending):
        collect = pending.collect

        def wrapper():
            start = time.perf_counter()
            pending.wait()
            t["wait"] += time.perf_counter() - start
            start = time.perf_counter()
            out = collect()
            t["collect"] += time.perf_counter() - start
            return out
        pending.collect = wrapper
        return pending

    patched = ((eng.scheduler, "schedule"), (eng.runner, "launch"),
               (eng.runner, "launch_ahead"), (eng.scheduler, "update_from_output"),
               (eng, "_postprocess"))
    timed(eng.scheduler, "schedule", "schedule")
    timed(eng.runner, "launch", "launch", wrap_result=waited)
    timed(eng.runner, "launch_ahead", "launch", wrap_result=waited)
    timed(eng.scheduler, "update_from_output", "update")
    timed(eng, "_postprocess", "outputs")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        eng.step()
    end_wait = time.perf_counter()
    torch.cuda.synchronize()  # the last step launched (async outputs) ends inside the window
    wall = time.perf_counter() - start
    t["wait"] += time.perf_counter() - end_wait
    for obj, attr in patched:
        delattr(obj, attr)  # the instance wrappers go; the class methods show again
    _finish(eng)
    us = {k: v / steps * 1e6 for k, v in t.items()}
    us["other"] = wall / steps * 1e6 - sum(us.values())
    us["wall"] = wall / steps * 1e6
    us["critical"] = (0.0 if eng.async_output and eng.run_ahead else
                      us["wall"] - us["wait"] - (us["outputs"] if eng.async_output else 0.0))
    return us


def phases_line(us: dict[str, float], mode: str) -> str:
    parts = ", ".join(f"{k} {us.get(k, 0.0):.0f}" for k in
                      ("schedule", "launch", "wait", "collect", "update", "outputs", "other"))
    return (f"host phases, {mode} (us/step): {parts}; host work the GPU waits for "
            f"{us['critical']:.0f} of {us['wall']:.0f} ({us['critical'] / us['wall']:.2f})")


def table(batch: int, kernels: dict[str, list[float]], graph_us: float, top: int) -> str:
    total = sum(us for _, us in kernels.values())
    launches = sum(c for c, _ in kernels.values())
    lines = [f"batch {batch}: kernels {total:.0f} us/step in {launches:.0f} launches; graph "
             f"replay step {graph_us:.0f} us (kernels / step {total / graph_us:.2f})",
             f"{'kernel':<48} | {'per step':>8} | {'us/step':>8} | {'share':>5} | us/launch"]
    for name, (count, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"{name:<48} | {count:>8.1f} | {us:>8.1f} | {us / total:>5.2f} | "
                     f"{us / count:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kernels_bench.py profile",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", type=Path, default=Path("/tmp/ckpt-llama2-7b-awq"))
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--kv-gib", type=float, default=16.0,
                    help="KV cache; must hold batch x (prompt + steps) tokens, or preemptions "
                         "put prefill into the measured steps")
    ap.add_argument("--max-model-len", type=int, default=0,
                    help="engine context limit (sizes the graphs' attention grid); default: "
                         "the prompt and the decode steps")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",")]
    if not (a.ckpt / "config.json").is_file():
        from random_checkpoint import make_random_checkpoint

        make_random_checkpoint("llama2-7b", "awq", a.ckpt, 128, "cuda")
    a.out.mkdir(parents=True, exist_ok=True)
    need_len = a.prompt + _new_tokens(max(batches), a.prompt, a.steps) + 8
    max_len = max(a.max_model_len, need_len)
    per_token = _kv_bytes_per_token(a.ckpt) // (2 if a.kv_cache_dtype == "fp8" else 1)
    need = max(batches) * need_len * per_token
    if need > a.kv_gib * (1 << 30):
        raise SystemExit(f"error: {max(batches)} x {need_len} tokens need "
                         f"{need / (1 << 30):.1f} GiB of KV cache; raise --kv-gib")
    results: dict = {"ckpt": str(a.ckpt), "prompt": a.prompt, "steps": a.steps, "batches": {}}
    nbytes, copy_gbs = _gemv_bytes(a.ckpt), 0.0
    if nbytes is not None:
        import torch

        from .kernel_timing import copy_bandwidth

        copy_gbs = results["copy_gb_s"] = copy_bandwidth(torch.device("cuda"), False) / 1e9
        torch.cuda.empty_cache()  # its 2 GiB of buffers back before the engines plan memory
    eager = _engine(a.ckpt, True, max(batches), max_len, a.kv_gib, a.kv_cache_dtype)
    eager_kernels = {b: decode_kernels(eager, b, a.prompt, a.steps) for b in batches}
    del eager
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    graphs = _engine(a.ckpt, False, max(batches), max_len, a.kv_gib, a.kv_cache_dtype)
    eng = graphs.engine
    for b in batches:
        ek = eager_kernels[b]
        res = {"kernels": ek.tally, "gemv_us_by_position": ek.gemv}
        for key, on, ahead in (("sync", False, False), ("async", True, False),
                               ("ahead", True, True)):
            eng.set_loop(async_output=on, run_ahead=ahead)
            res[f"graph_step_us_{key}"] = graph_step_us(graphs, b, a.prompt, a.steps)
            res[f"host_phases_us_{key}"] = host_phases(graphs, b, a.prompt, a.steps)
        gk = decode_kernels(graphs, b, a.prompt, a.steps)
        res.update(graph_kernels=gk.tally, graph_path=gk.path, graph_path_gemv=gk.path_gemv,
                   graph_idle_us=gk.idle)
        results["batches"][b] = res
        sync_us, async_us = res["graph_step_us_sync"], res["graph_step_us_async"]
        ahead_us = res["graph_step_us_ahead"]
        print(table(b, ek.tally, ahead_us, a.top), flush=True)
        if b == 1 and ek.gemv is not None:
            print(gemv_table(ek.gemv, nbytes, copy_gbs), flush=True)
        print("with CUDA graphs: " + table(b, gk.tally, ahead_us, a.top), flush=True)
        if sum(us for _, us in gk.tally.values()) > ahead_us:
            # a kernel launched early by programmatic dependent launch waits inside its
            # predecessor's time, so the replayed kernels overlap and their times add up to
            # more than the step
            print("(the replayed kernels overlap: their times are not the step's; the "
                  "critical path below is)")
        print(f"with CUDA graphs, what each kernel adds to the step (critical path; the "
              f"stream idle {gk.idle:.0f} us a step): "
              + table(b, gk.path, ahead_us, a.top), flush=True)
        if b == 1 and gk.path_gemv is not None:
            print("  critical path: " + gemv_table(gk.path_gemv, nbytes, copy_gbs), flush=True)
        print(f"graph step: {sync_us:.0f} us with sync outputs, {async_us:.0f} with async "
              f"outputs ({sync_us / async_us:.3f}x), {ahead_us:.0f} with run-ahead as well "
              f"({sync_us / ahead_us:.3f}x)")
        for mode, key in (("sync outputs", "sync"), ("async outputs", "async"),
                          ("run-ahead", "ahead")):
            print(phases_line(res[f"host_phases_us_{key}"], mode), flush=True)
        print()
    (a.out / "profile_kernels.json").write_text(json.dumps(results, indent=1))
    return 0

