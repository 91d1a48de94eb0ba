"""How busy the serving path keeps an emulated GPU, and the host CPU per streamed token.

    python benchmarks/serving_host.py [--levels 1,8,32,64] [--requests 64] [--prompt 256]
        [--tokens 128] [--gpu-ms 2.2,0.09,0.03] [--eager-ms 40] [--batched 2048] [--cap N]
        [--inproc] [--no-run-ahead]

Why: one Python process runs the engine's host work (scheduling, input tensors,
detokenizing, outputs) on a worker thread and the HTTP work of every stream (chunks, JSON,
SSE frames, socket writes) on the event loop, under one GIL. On a fast GPU the host can be
the limit: at 64 streams the H200 runs a 7B decode step in ~8 ms, so each 100 us of host
work per token is most of a step.

This runs the real server (Litestar app, AsyncEngine, LLMEngine with async output
processing and decode run-ahead) on the demo model in a child process, its forward replaced
by ``emulated_gpu.py``. The defaults model the H200's 7B AWQ figures (BENCHMARKS.md): a
2.2 ms one-row decode step, 0.09 ms more per decode row, 0.03 ms per prefill token, 40 ms of
Python launching a step of more than 512 tokens (no CUDA graph). Clients stream
``/v1/completions`` from this process (``e2e_serving.run_level``: ``c`` clients in a closed
loop, random-token prompts, greedy, ``ignore_eos``), as ``e2e.py --scenarios serving`` does.

Per concurrency level: output tok/s; the emulated GPU's busy fraction (1.0: it never waited
for the host); TTFT and inter-token p50 / p99; the server's CPU time per output token by
thread (engine worker, event loop, the rest); then launches by kind with the GPU's idle time
before them. ``--inproc`` adds rows with no server: the same emulated engine stepped by this
process, a finished request replaced at once (the engine's host work alone).
``--py-spy-out PATH`` records the server's stacks at each level (py-spy, collapsed) to
PATH.LEVEL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from lib.emulated_gpu import EmulatedGPU, emulate  # noqa: E402 - after the path


def engine_config(args: argparse.Namespace):
    from edge_llm.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig

    # fp8 codes: a quarter of the demo model's fp32 bytes, room for every stream at full length
    return EngineConfig(
        model=ModelConfig(max_model_len=args.max_len),
        cache=CacheConfig(kv_cache_dtype="fp8", swap_space=0.0,
                          kv_cache_memory=args.max_seqs * args.max_len * 12 * 1024),
        scheduler=SchedulerConfig(max_num_seqs=args.max_seqs,
                                  max_num_batched_tokens=args.batched,
                                  max_tokens_with_decodes=args.cap),
        # emulate() sets async output and run-ahead on the built engine
        enforce_eager=True)


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads (the scheduler's nanosecond count): the
    engine's worker, the main thread (the server's event loop) and the rest together."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    cpu: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
        except OSError:  # the thread ended
            continue
        tid = int(task.name)
        key = ("event loop" if tid == os.getpid() else
               "engine" if names.get(tid, "").startswith("edge-llm-engine") else "other")
        cpu[key] = cpu.get(key, 0.0) + ns / 1e9
    return cpu


# ---- the child: the server ----------------------------------------------------------------

def child(args: argparse.Namespace) -> None:
    import uvicorn

    from edge_llm.config import ServerConfig
    from edge_llm.engine.async_engine import AsyncEngine
    from edge_llm.engine.llm_engine import LLMEngine
    from edge_llm.server import create_app

    gpu = EmulatedGPU(*args.gpu, args.eager_ms)
    cfg = engine_config(args)

    def factory():
        engine = LLMEngine(cfg)
        emulate(engine, gpu, args.run_ahead)
        return AsyncEngine(engine)

    def report(*_):
        tmp = Path(args.stats + ".tmp")
        tmp.write_text(json.dumps({"busy": gpu.busy, "steps": gpu.steps, "idle": gpu.idle,
                                   "launches": gpu.launches,
                                   "now": time.perf_counter(),
                                   "cpu": thread_cpu()}))
        tmp.rename(args.stats)

    def failed(exc: BaseException) -> None:
        print(f"error: the model failed to load: {exc}", file=sys.stderr, flush=True)
        os._exit(1)

    signal.signal(signal.SIGUSR1, report)
    app = create_app(cfg, ServerConfig(log_requests=False), engine_factory=factory,
                     on_load_failure=failed)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                log_config=None)


def served_levels(args: argparse.Namespace, prompts) -> list[dict]:
    from lib import e2e_serving

    port = e2e_serving.free_port()
    stats = Path(f"/tmp/serving_host_{os.getpid()}.json")
    cmd = [sys.executable, __file__, "--child", "--port", str(port), "--stats", str(stats),
           "--gpu-ms", ",".join(f"{x:g}" for x in args.gpu), "--max-seqs", str(args.max_seqs),
           "--max-len", str(args.max_len), "--eager-ms", str(args.eager_ms), "--batched",
           str(args.batched)]
    cmd += [] if args.cap is None else ["--cap", str(args.cap)]
    cmd += [] if args.run_ahead else ["--no-run-ahead"]
    proc = subprocess.Popen(cmd, cwd="/tmp")
    url = f"http://127.0.0.1:{port}"

    def sample() -> dict:
        stats.unlink(missing_ok=True)
        proc.send_signal(signal.SIGUSR1)
        while not stats.exists():
            if proc.poll() is not None:
                raise SystemExit(f"error: the server exited ({proc.returncode})")
            time.sleep(0.01)
        return json.loads(stats.read_text())

    try:
        if not e2e_serving.wait_healthy(url, proc, time.perf_counter() + 600):
            raise SystemExit("error: the server did not start")
        asyncio.run(e2e_serving.run_level(url, 1, prompts(2), args.tokens))  # warm
        rows = []
        for level in args.levels:
            spy = None
            if args.py_spy_out:  # the server's stacks at this level
                spy = subprocess.Popen(["py-spy", "record", "--threads", "--format", "raw",
                                        "-r", "400", "-p", str(proc.pid), "-o",
                                        f"{args.py_spy_out}.{level}"])
                time.sleep(1.0)
            before = sample()
            r = asyncio.run(e2e_serving.run_level(url, level, prompts(max(level, args.requests)),
                                                  args.tokens))
            after = sample()
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
            cpu = {k: after["cpu"].get(k, 0.0) - before["cpu"].get(k, 0.0)
                   for k in ("engine", "event loop", "other")}
            rows.append({"mode": "served", "level": level, "tok_s": r["output_tok_s"],
                         "busy": (after["busy"] - before["busy"]) / (after["now"] - before["now"]),
                         "ttft": r["ttft_ms"]["p50"], "itl50": r["itl_ms"]["p50"],
                         "itl99": r["itl_ms"]["p99"],
                         "us_tok": {k: v * 1e6 / r["tokens"] for k, v in cpu.items()},
                         "idle": {k: v - before["idle"].get(k, 0.0)
                                  for k, v in after["idle"].items()},
                         "steps": after["steps"] - before["steps"],
                         "launches": {k: v - before["launches"].get(k, 0)
                                      for k, v in after["launches"].items()}})
        return rows
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        stats.unlink(missing_ok=True)


def inproc_level(engine, gpu: EmulatedGPU, level: int, prompts: list[list[int]],
                 tokens: int) -> dict:
    """Closed loop of ``level`` clients on the engine itself, no server."""
    from edge_llm import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    todo, n_out, running = list(prompts), 0, 0
    t0, busy0, cpu0 = time.perf_counter(), gpu.busy, time.process_time()
    idle0, steps0, launches0 = dict(gpu.idle), gpu.steps, dict(gpu.launches)
    while todo or engine.has_unfinished():
        while todo and running < level:
            engine.add_request(f"r{len(todo)}-{level}", {"prompt_token_ids": todo.pop()}, params)
            running += 1
        for out in engine.step():
            if out.finished:
                running -= 1
                n_out += len(out.outputs[0].token_ids)
    seconds = time.perf_counter() - t0
    return {"mode": "in process", "level": level, "tok_s": n_out / seconds,
            "busy": (gpu.busy - busy0) / seconds, "ttft": None, "itl50": None, "itl99": None,
            "us_tok": {"engine": (time.process_time() - cpu0) * 1e6 / n_out},
            "idle": {k: v - idle0.get(k, 0.0) for k, v in gpu.idle.items()},
            "steps": gpu.steps - steps0,
            "launches": {k: v - launches0.get(k, 0) for k, v in gpu.launches.items()}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="1,8,32,64")
    ap.add_argument("--requests", type=int, default=64, help="requests per level, at least")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--gpu-ms", default="2.2,0.09,0.03",
                    help="emulated step: base ms, ms per decode row, ms per prefill token")
    ap.add_argument("--eager-ms", type=float, default=40.0,
                    help="host ms launching a step of more than 512 tokens (no CUDA graph)")
    ap.add_argument("--batched", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--cap", type=int, default=None, help="max_tokens_with_decodes")
    ap.add_argument("--inproc", action="store_true", help="also the engine alone, no server")
    ap.add_argument("--no-run-ahead", dest="run_ahead", action="store_false",
                    help="launch each step after its predecessor's tokens are read")
    ap.add_argument("--py-spy-out", metavar="PATH", default=None,
                    help="record the server's stacks at each level with py-spy to PATH.LEVEL")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--stats", help=argparse.SUPPRESS)
    ap.add_argument("--max-seqs", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--max-len", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.gpu = [float(x) for x in args.gpu_ms.split(",")]
    if len(args.gpu) != 3:
        ap.error("--gpu-ms takes three numbers: base,per_row,per_token")
    if not args.child:
        args.levels = [int(x) for x in args.levels.split(",")]
        args.max_seqs = max(args.levels)
        args.max_len = args.prompt + args.tokens + 16
    return args


def run(args: argparse.Namespace) -> list[dict]:
    """The served levels, then (``--inproc``) the in-process ones: one dict per row."""
    from lib.e2e_common import PromptMaker

    maker = PromptMaker(49152, seed=0)

    def prompts(n: int) -> list[list[int]]:
        return maker.batch(n, args.prompt)

    rows = served_levels(args, prompts)
    if args.inproc:
        from edge_llm.engine.llm_engine import LLMEngine

        gpu = EmulatedGPU(*args.gpu, args.eager_ms)
        engine = LLMEngine(engine_config(args))
        emulate(engine, gpu, args.run_ahead)
        rows += [inproc_level(engine, gpu, level, prompts(max(level, args.requests)), args.tokens)
                 for level in args.levels]
    return rows


def main() -> None:
    args = parse_args()
    if args.child:
        child(args)
        return
    rows = run(args)
    print(f"emulated GPU step: {args.gpu[0]:g} ms + {args.gpu[1]:g} ms a decode row + "
          f"{args.gpu[2]:g} ms a prefill token; over 512 tokens {args.eager_ms:g} ms of host "
          f"launch; {args.prompt}-token prompts, {args.tokens} tokens out; "
          f"max_num_batched_tokens {args.batched}, max_tokens_with_decodes {args.cap}")
    print("mode | streams | output tok/s | GPU busy | TTFT p50 ms | ITL p50 / p99 ms | "
          "host CPU us / token: engine, event loop, other")
    for r in rows:
        lat = ("- | -" if r["ttft"] is None else
               f"{r['ttft']:.1f} | {r['itl50']:.2f} / {r['itl99']:.2f}")
        us = ", ".join(f"{r['us_tok'].get(k, 0.0):.0f}" for k in ("engine", "event loop", "other"))
        print(f"{r['mode']} | {r['level']} | {r['tok_s']:.0f} | {r['busy']:.2f} | {lat} | {us}")
    print("launches by kind: count, GPU idle before them (ms per launch)")
    for r in rows:
        idle = "; ".join(f"{k} {n}, {r['idle'].get(k, 0.0) * 1e3 / n:.3f}"
                         for k, n in sorted(r["launches"].items()))
        print(f"  {r['mode']} {r['level']}: {idle}")


if __name__ == "__main__":
    main()
