"""Starting the engine alone from a benchmark (where the server cannot run, or to look inside
a start): ``worker`` builds it in a fresh process with serve's start-up phases (import with the
CUDA context beside it, weight load, KV allocation, kernel warm-up, CUDA graphs, the warm-up
requests), then sleeps and wakes it; ``engine_start`` runs that process and turns its stamps
into seconds since its launch."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def worker(model: str, device: str, profile: Path | None = None, prep: bool = True) -> None:
    """The engine alone in this fresh process, phase by phase (stamps are time.time()), with
    the device preparation `edge-llm serve` starts beside its imports (``prep``; off: what
    it buys). ``profile``: where the engine construction's cProfile listing goes
    (``write_profile``). Prints one JSON line."""
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
    # counted as the server counts them: the decode and the prefill graphs
    graphs_s = runner.graph_stats.seconds + runner.prefill_graph_stats.seconds
    print(json.dumps({"stamps": stamps, "load_s": engine.loaded.load_seconds,
                      "graphs_s": graphs_s, "kernels_s": runner.kernel_warmup_seconds,
                      "prep": done, "sleep_s": slept, "wake_s": woke,
                      "first_token_after_wake_s": time.perf_counter() - began}), flush=True)


def write_profile(profiler: Any, path: Path) -> None:
    """The 40 costliest calls of ``profiler``, cumulative, then the 25 with the most time of
    their own, as pstats prints them."""
    import pstats

    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(40)
    stats.sort_stats("tottime").print_stats(25)
    path.write_text(text.getvalue())


def engine_start(script: Path, model: Path, device: str, timeout: float,
                 profile: Path | None = None, prep: bool = True,
                 env: dict[str, str] | None = None) -> dict[str, Any]:
    """``worker`` in a fresh process (``script --worker MODEL``, which calls it), its phases
    and measures in seconds since the launch. ``env``: the worker's environment (default:
    this process's)."""
    cmd = [sys.executable, str(script), "--worker", str(model), "--device", device]
    if profile is not None:
        cmd += ["--profile-to", str(profile)]
    if not prep:
        cmd.append("--no-device-prep")
    launched = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"engine worker failed:\n{res.stderr[-3000:]}")
    w = json.loads(res.stdout.strip().splitlines()[-1])
    s = {k: v - launched for k, v in w["stamps"].items()}
    phases = {"import": s["imported"]}
    if w["prep"] and w["prep"]["context_seconds"] is not None:
        phases["cuda_context"] = w["prep"]["context_seconds"]  # beside the import
    phases.update({"weight_load": w["load_s"],
                   "kv_allocation": s["built"] - s["imported"] - w["load_s"] - w["kernels_s"]
                   - w["graphs_s"], "kernel_warmup": w["kernels_s"],
                   "cuda_graphs": w["graphs_s"], "warmup": s["ready"] - s["built"],
                   "ready": s["ready"]})
    return {"ready": s["ready"], "first_token": s["first"], "phases": phases, "prep": w["prep"],
            "sleep_s": w["sleep_s"], "wake_s": w["wake_s"],
            "first_token_after_wake_s": w["first_token_after_wake_s"], "exit_code": 0}
