"""GPU cold start (issue #6): a random Llama-2-7B-shape AWQ checkpoint on local disk, against a
plain read of the same files into GPU memory.

    python benchmarks/cold_start_gpu.py --out $OUT                    # on the GPU machine
    python benchmarks/cold_start_gpu.py --shape tiny-llama --device cpu --out DIR   # smoke

1. Page cache: ``echo 3 > /proc/sys/vm/drop_caches`` is tried (root); whether it worked (the
   kernel's Cached figure before and after) is recorded. Without it every read is warm.
2. Plain read: each safetensors file read with ``readinto`` into two pinned host buffers in
   turn, each chunk copied to one device tensor (asynchronously, the next read overlaps the
   copy): GB/s with a cold page cache (after a drop) and with a warm one.
3. Starts: ``edge-llm serve`` (``cold_start.one_start``), or without litestar the engine in a
   fresh process with the same phases (import, CUDA context beside it, weight load, KV
   allocation, kernel warm-up, CUDA graphs, warm-up; a table of them follows the main one;
   ``--engine-only --profile`` adds each construction's cProfile listing). Start 1
   follows a page-cache drop and has empty compile caches (a fresh ``EDGE_LLM_CACHE_DIR``);
   start 2 follows another drop and reuses the compile caches (what a platform's
   scale-from-zero start sees with the cache on a volume); start 3 has both warm. With
   ``--bake`` the caches come from ``edge-llm warmup`` instead (an image's build step), and
   every start finds them.
   Each: process start -> ready, -> first token; weight-load GB/s (the
   checkpoint bytes over the weight_load phase) as a fraction of the plain read of the same
   cache state; then level-1 sleep and the wake-up's seconds.

Targets: ready and first token <= 7 s with a warm page cache and compile caches, <= 15 s
after a page-cache drop; weight load >= 50% of the plain read; wake < 2 s.
Writes cold_start.json and cold_start.log under --out and prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from e2e_common import (
    DEFAULT_CKPT_DIR,
    MiB,
    Results,
    ensure_checkpoint,
    environment,
    free_device_memory,
    log,
    setup_logging,
    synchronize,
)

# issue #37: ready and first token within 7 s with warm caches (page cache and compile
# caches), within 15 s on a fresh machine whose image carries the compile caches
TARGETS = {"ready_s": 15.0, "first_token_s": 15.0, "warm_s": 7.0, "load_fraction": 0.5,
           "wake_s": 2.0}


def _cached_mb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("Cached:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def drop_page_cache() -> dict[str, Any]:
    """Try to empty the page cache; ok is False (with the reason) where it is not allowed."""
    before = _cached_mb()
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as exc:
        return {"ok": False, "detail": f"drop_caches refused: {exc.strerror or exc}"}
    after = _cached_mb()
    return {"ok": True, "cached_mb_before": before, "cached_mb_after": after,
            "detail": f"Cached {before:.0f} -> {after:.0f} MB" if before and after else ""}


def plain_read(files: list[Path], device: str, chunk: int = 64 * MiB) -> dict[str, Any]:
    """Read ``files`` into one device tensor through two (pinned on CUDA) host buffers."""
    import torch

    cuda = device.startswith("cuda")
    total = sum(f.stat().st_size for f in files)
    bufs = [torch.empty(chunk, dtype=torch.uint8, pin_memory=cuda) for _ in range(2)]
    views = [memoryview(b.numpy()) for b in bufs]
    done: list[Any] = [None, None]  # the copy out of each buffer, once issued
    dst = torch.empty(total, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream() if cuda else None
    synchronize(device)
    began = time.perf_counter()
    offset = turn = 0
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while True:
                i = turn % 2
                if done[i] is not None:
                    done[i].synchronize()  # that buffer's last copy has left it
                n = fh.readinto(views[i])
                if not n:
                    break
                if cuda:
                    with torch.cuda.stream(stream):
                        dst[offset:offset + n].copy_(bufs[i][:n], non_blocking=True)
                        done[i] = torch.cuda.Event()
                        done[i].record(stream)
                else:
                    dst[offset:offset + n].copy_(bufs[i][:n])
                offset += n
                turn += 1
    synchronize(device)
    seconds = time.perf_counter() - began
    if offset != total:
        raise RuntimeError(f"read {offset} bytes, the files hold {total}")
    del dst, bufs, views
    free_device_memory(device)  # the servers started next size their KV from free memory
    return {"bytes": total, "seconds": seconds, "gb_s": total / 1e9 / seconds, "pinned": cuda}


def sleep_and_wake(url: str) -> dict[str, Any]:
    """POST /sleep?level=1, /health while asleep, POST /wake_up, then a first token again."""
    import httpx

    deadline = time.perf_counter() + 30
    while True:  # 409 while the first-token request (closed early) is still being aborted
        began = time.perf_counter()
        r = httpx.post(url + "/sleep", params={"level": 1}, timeout=600)
        slept = time.perf_counter() - began
        if r.status_code != 409 or time.perf_counter() > deadline:
            r.raise_for_status()
            break
        time.sleep(0.05)
    health = httpx.get(url + "/health", timeout=10).status_code
    began = time.perf_counter()
    httpx.post(url + "/wake_up", timeout=600).raise_for_status()
    woke = time.perf_counter() - began
    body = {"prompt": "The capital of France is", "max_tokens": 4, "stream": True}
    began = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                first = time.perf_counter() - began
                break
    return {"sleep_s": slept, "health_asleep": health, "wake_s": woke,
            "first_token_after_wake_s": first}


def worker(model: str, device: str, profile: Path | None = None, prep: bool = True) -> None:
    """The engine alone in this fresh process, phase by phase (stamps are time.time()), with
    the device preparation `edge-llm serve` starts beside its imports (``prep``; off: what
    it buys). ``profile``: where the engine construction's cProfile listing goes (the 40
    costliest calls, cumulative)."""
    stamps: dict[str, float] = {}
    from edge_llm.engine.device_prep import start_device_prep

    prepared = start_device_prep(device) if prep else None
    from edge_llm.config import EngineConfig, ModelConfig
    from edge_llm.engine.llm_engine import LLMEngine
    from edge_llm.sampling_params import SamplingParams

    done = None if prepared is None else vars(prepared.join())  # as serve's factory waits
    stamps["imported"] = time.time()
    profiler = None
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    engine = LLMEngine(EngineConfig(model=ModelConfig(model=model, device=device)))
    stamps["built"] = time.time()
    if profiler is not None:
        profiler.disable()
        write_profile(profiler, profile)

    def run(prompts: list[list[int]], tokens: int) -> float:
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        for i, p in enumerate(prompts):
            engine.add_request(f"r{time.time()}-{i}", p, params)
        while engine.has_unfinished():
            for out in engine.step():
                if out.outputs and out.outputs[0].token_ids and "first" not in stamps:
                    stamps["first"] = time.time()
        return time.time()

    # the server's built-in warm-up: 3 decode steps at batch 1, then at batch 4
    run([[1] + list(range(10, 26))], 3)
    run([[1, 5 + i] + list(range(10, 26)) for i in range(4)], 3)
    stamps["ready"] = time.time()
    stamps.pop("first", None)
    run([[1] + list(range(30, 40))], 1)
    began = time.perf_counter()
    engine.sleep(1)
    slept = time.perf_counter() - began
    began = time.perf_counter()
    engine.wake_up()
    woke = time.perf_counter() - began
    began = time.perf_counter()
    run([[1] + list(range(40, 50))], 1)
    runner = engine.runner
    graphs_s = runner.graph_stats.seconds + runner.prefill_graph_stats.seconds
    print(json.dumps({"stamps": stamps, "load_s": engine.loaded.load_seconds,
                      "graphs_s": graphs_s, "kernels_s": runner.kernel_warmup_seconds,
                      "prep": done,
                      "sleep_s": slept, "wake_s": woke,
                      "first_token_after_wake_s": time.perf_counter() - began}), flush=True)


def write_profile(profiler: Any, path: Path) -> None:
    import io
    import pstats

    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
    path.write_text(text.getvalue())


def engine_start(model: Path, device: str, timeout: float,
                 profile: Path | None = None, prep: bool = True) -> dict[str, Any]:
    """The fallback start: ``worker`` in a fresh process, seconds since its launch."""
    cmd = [sys.executable, __file__, "--worker", str(model), "--device", device]
    if profile is not None:
        cmd += ["--profile-to", str(profile)]
    if not prep:
        cmd.append("--no-device-prep")
    launched = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"engine worker failed:\n{res.stderr[-3000:]}")
    w = json.loads(res.stdout.strip().splitlines()[-1])
    s = {k: v - launched for k, v in w["stamps"].items()}
    phases = {"import": s["imported"], "weight_load": w["load_s"],
              "kv_allocation": s["built"] - s["imported"] - w["load_s"] - w["kernels_s"]
              - w["graphs_s"], "kernel_warmup": w["kernels_s"], "cuda_graphs": w["graphs_s"],
              "warmup": s["ready"] - s["built"], "ready": s["ready"]}
    if w["prep"] and w["prep"]["context_seconds"] is not None:
        phases["cuda_context"] = w["prep"]["context_seconds"]
    return {"ready": s["ready"], "first_token": s["first"], "phases": phases, "prep": w["prep"],
            "sleep_s": w["sleep_s"], "wake_s": w["wake_s"],
            "first_token_after_wake_s": w["first_token_after_wake_s"], "exit_code": 0}


def server_available() -> str | None:
    try:
        import litestar  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


def one(model: Path, args, cache_dir: Path, use_server: bool,
        keep_log: Path | None = None, profile: Path | None = None) -> dict[str, Any]:
    """One start with ``EDGE_LLM_CACHE_DIR`` (and Triton's cache under it) set to cache_dir."""
    for var in ("TORCHINDUCTOR_CACHE_DIR",):
        os.environ.pop(var, None)
    os.environ["EDGE_LLM_CACHE_DIR"] = str(cache_dir)
    os.environ["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    if use_server:
        from cold_start import one_start

        # the sleep routes are off by default; this run measures them
        extra = ["--device", args.device, "--enable-sleep-endpoints", *args.serve_arg]
        return one_start(str(model), extra, args.timeout, after=sleep_and_wake,
                         keep_log=keep_log)
    return engine_start(model, args.device, args.timeout, profile, args.device_prep)


def bake(model: Path, args, cache_dir: Path) -> dict[str, Any]:
    """The image build step (recipes/warm-cache): ``edge-llm warmup`` with the starts' flags
    fills ``cache_dir``; the starts then find every kernel and probe there."""
    env = {**os.environ, "EDGE_LLM_CACHE_DIR": str(cache_dir),
           "TRITON_CACHE_DIR": str(cache_dir / "triton")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    cmd = [sys.executable, "-m", "edge_llm.cli", "warmup", str(model), "--device", args.device,
           *args.serve_arg]
    began = time.perf_counter()
    # from outside the checkout, as the starts run (the installed package is imported)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env,
                         cwd=tempfile.gettempdir())
    done = [ln for ln in res.stderr.splitlines() if "Warm-up only: done." in ln]
    return {"seconds": time.perf_counter() - began, "exit_code": res.returncode,
            "summary": done[-1].split("done. ", 1)[-1] if done else "",
            "log_tail": res.stderr[-3000:]}


def phase_table(starts: list[dict[str, Any]]) -> str:
    """Seconds per start-up phase, one row per start, the phases in the order the starts
    recorded them (``cuda_context`` runs beside ``import``; ``ready``, last, counts from the
    process start)."""
    names = list(dict.fromkeys(p for r in starts for p in r["phases"] if p != "ready"))
    names.append("ready")
    rows = [("start", *names)]
    for i, r in enumerate(starts, 1):
        rows.append((str(i), *(f"{r['phases'][p]:.2f}" if p in r["phases"] else "-"
                               for p in names)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
                     for row in rows)


def table(starts: list[dict[str, Any]]) -> str:
    """One row per start; each measure is followed by whether it meets its target."""
    def mark(value: float | None, ok: bool) -> str:
        return "n/a" if value is None else f"{value:.3g} {'ok' if ok else 'NO'}"

    head = ("start", "page cache", "compile cache", "ready s (<15, warm <7)",
            "first token s (<15, warm <7)", "load GB/s", "load / plain read (>=0.5)",
            "wake s (<2)")
    rows = [head]
    for i, r in enumerate(starts, 1):
        first, wake = r.get("first_token"), r.get("wake_s")
        warm = r["page_cache"] == "warm"
        ready_max = TARGETS["warm_s"] if warm else TARGETS["ready_s"]
        first_max = TARGETS["warm_s"] if warm else TARGETS["first_token_s"]
        rows.append((f"{i} {r.get('env', '')}".strip(), r["page_cache"], r["compile_cache"],
                     mark(r["ready"], r["ready"] <= ready_max),
                     mark(first, first is not None and first <= first_max),
                     f"{r['load_gb_s']:.3g}",
                     mark(r["load_fraction"], r["load_fraction"] >= TARGETS["load_fraction"]),
                     mark(wake, wake is not None and wake < TARGETS["wake_s"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
                     for row in rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for cold_start.json and .log")
    ap.add_argument("--shape", default="llama2-7b")
    ap.add_argument("--ckpt-dir", type=Path, default=DEFAULT_CKPT_DIR)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--starts", type=int, default=3,
                    help="1: cold page cache, empty compile cache; 2: cold page cache, compile "
                         "cache reused (a scale-from-zero start); 3 and later: both warm")
    ap.add_argument("--cold-starts", type=int, default=2,
                    help="how many starts, from the first, follow a page-cache drop")
    ap.add_argument("--start-env", action="append", default=[], metavar="I:KEY=VALUE",
                    help="an environment variable for start I only (repeat), e.g. "
                         "3:EDGE_LLM_PROBE_CACHE=0, to compare starts of the same state")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per start")
    ap.add_argument("--engine-only", action="store_true",
                    help="start the engine in a subprocess even where the server could run")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="EDGE_LLM_CACHE_DIR for the starts (default: a fresh, empty one)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra flag for serve (repeat), e.g. --serve-arg=--max-model-len=4096")
    ap.add_argument("--drop-caches", action=argparse.BooleanOptionalAction, default=None,
                    help="drop the page cache before cold reads (default: on with CUDA only, "
                         "so shared CPU machines keep theirs)")
    ap.add_argument("--profile", action="store_true",
                    help="with --engine-only: each start's engine construction under cProfile "
                         "(profile<i>.txt under --out: where kv_allocation and the kernel "
                         "warm-up spend their time; the phases then run slower)")
    ap.add_argument("--device-prep", action=argparse.BooleanOptionalAction, default=True,
                    help="with --engine-only: the CUDA context and Triton's hash on a thread "
                         "beside the imports, as serve does (--no-device-prep: without, to "
                         "see what that overlap buys)")
    ap.add_argument("--bake", action="store_true",
                    help="fill the compile cache with `edge-llm warmup` first (the image build "
                         "step of recipes/warm-cache), then start every time from it: what a "
                         "fresh machine whose image carries the caches sees")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--profile-to", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is None and args.out is None:
        ap.error("--out is required")
    if args.starts < 1:
        ap.error("--starts must be >= 1")
    if args.profile and not args.engine_only:
        ap.error("--profile needs --engine-only (the server loads the engine on a thread)")
    if not args.device_prep and not args.engine_only and args.worker is None:
        ap.error("--no-device-prep needs --engine-only (serve always prepares the device)")
    args.env = {}
    for item in args.start_env:
        index, sep, pair = item.partition(":")
        key, eq, value = pair.partition("=")
        if not (sep and eq and key and index.isdigit()):
            ap.error(f"--start-env takes I:KEY=VALUE, got {item!r}")
        args.env.setdefault(int(index), {})[key] = value
    args.ckpt_dir = args.ckpt_dir.resolve()  # the server runs in another directory
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker, args.device, args.profile_to, args.device_prep)
        return 0
    setup_logging(args.out, "cold_start")
    missing = None if args.engine_only else server_available()
    use_server = not args.engine_only and missing is None
    mode = "server" if use_server else (
        "engine subprocess (--engine-only)" if args.engine_only
        else f"engine subprocess (no server here: {missing})")
    results = Results(args.out / "cold_start.json", {
        "env": environment(), "shape": args.shape, "device": args.device, "mode": mode,
        "targets": TARGETS, "started": time.strftime("%Y-%m-%d %H:%M:%S")})
    model = ensure_checkpoint(args.shape, "awq", args.ckpt_dir)
    files = sorted(model.glob("*.safetensors"))
    nbytes = sum(f.stat().st_size for f in files)
    data = results.shape(args.shape)
    data.update(checkpoint=str(model), checkpoint_bytes=nbytes, mode=mode)
    if args.drop_caches is None:
        args.drop_caches = args.device.startswith("cuda")
    drop = drop_page_cache() if args.drop_caches else {"ok": False, "detail": "not asked"}
    data["drop_caches"] = drop
    log.info("mode: %s; page cache drop: %s %s", mode, drop["ok"], drop["detail"])
    reads = {}
    if drop["ok"]:
        reads["cold"] = plain_read(files, args.device)
    reads["warm"] = plain_read(files, args.device)
    data["plain_read"] = reads
    for state, r in reads.items():
        log.info("plain read (%s page cache, %s): %.2f GB/s", state,
                 "pinned buffers" if r["pinned"] else "host buffers", r["gb_s"])
    results.save()
    cache_dir = args.cache_dir or Path(tempfile.mkdtemp(prefix="compile-cache-",
                                                        dir=args.ckpt_dir))
    if args.bake:
        data["bake"] = bake(model, args, cache_dir)
        results.save()
        log.info("bake (edge-llm warmup): %.1f s, exit %d: %s", data["bake"]["seconds"],
                 data["bake"]["exit_code"], data["bake"]["summary"])
        if data["bake"]["exit_code"] != 0:
            results.error(args.shape, "bake", RuntimeError("edge-llm warmup failed"),
                          data["bake"]["log_tail"])
            return 1
    starts = []
    for i in range(1, args.starts + 1):
        state = "cold" if i <= args.cold_starts and drop["ok"] else "warm"
        if state == "cold":
            drop_page_cache()
        env = args.env.get(i, {})
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            r = one(model, args, cache_dir, use_server, keep_log=args.out / f"server{i}.log",
                    profile=args.out / f"profile{i}.txt" if args.profile else None)
        except Exception as exc:  # noqa: BLE001 - recorded, the next start still runs
            results.error(args.shape, f"start {i}", exc, repr(exc)[-3000:])
            continue
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        r["env"] = " ".join(f"{k}={v}" for k, v in env.items())
        r["page_cache"] = state
        r["compile_cache"] = ("baked" if args.bake else "given" if args.cache_dir
                              else "empty" if i == 1 else "reused")
        r["load_gb_s"] = nbytes / 1e9 / r["phases"]["weight_load"]
        r["load_fraction"] = r["load_gb_s"] / reads[state]["gb_s"]
        starts.append(r)
        results.put(args.shape, f"start{i}", r)
        log.info("start %d%s: ready %.2f s, first token %.2f s, load %.2f GB/s (%.0f%% of the "
                 "plain read), wake %.2f s; phases %s", i, f" ({r['env']})" if r["env"] else "",
                 r["ready"], r.get("first_token") or -1, r["load_gb_s"],
                 100 * r["load_fraction"], r.get("wake_s") or -1,
                 " ".join(f"{k} {v:.2f}" for k, v in r["phases"].items() if k != "ready"))
    if starts:
        text, phases = table(starts), phase_table(starts)
        data["table"], data["phase_table"] = text.splitlines(), phases.splitlines()
        results.save()
        log.info("cold start (%s, %s):\n%s\nstart-up phases (s):\n%s", args.shape, mode, text,
                 phases)
    return 1 if results.data["errors"] or not starts else 0


if __name__ == "__main__":
    raise SystemExit(main())
