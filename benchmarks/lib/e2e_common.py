"""Shared pieces of the end-to-end benchmarks (``e2e.py``, ``cold_start.py``).

Profiles (run sizes), random-weight checkpoints on local disk, fresh random prompts, the
device copy bandwidth, the bytes one decode step must read, a time budget, and the results file.
Nothing here loads the engine; torch is imported inside the functions that need it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edge_llm import envs

BENCHMARKS = Path(__file__).resolve().parents[1]  # random_checkpoint.py's folder
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

log = logging.getLogger("e2e")
GiB = 1 << 30
MiB = 1 << 20
DEFAULT_CKPT_DIR = Path("/tmp/edge-llm-bench")  # the scripts' --ckpt-dir default


@dataclass(frozen=True)
class Profile:
    """Sizes of one run. Token counts are per request; ranges are inclusive (lo, hi)."""

    name: str
    shapes: tuple[str, ...]
    device: str = "cuda"
    max_model_len: int = 4096
    # the in-process engine and the served one; None: the engine's own sizing (90% of the
    # GPU's memory, as a user runs it): a smaller cache makes the offline run preempt and
    # measures the preemptions instead of the engine
    kv_cache_memory: int | None = None
    kv_cache_dtype: str = "auto"  # "fp8": e4m3 codes (kernels/kv_fp8.py)
    decode_prompt: int = 128
    decode_tokens: int = 256
    decode_batches: tuple[int, ...] = (1, 4, 16)
    offline_requests: int = 256
    offline_prompt: tuple[int, int] = (128, 1024)
    offline_output: tuple[int, int] = (128, 512)
    gen_seqs: int = 64
    gen_prompt: int = 512
    gen_tokens: int = 128
    serve_levels: tuple[int, ...] = (1, 8, 32, 64)
    serve_min_requests: int = 8  # per concurrency level: max(level, this) requests
    serve_prompt: int = 256
    serve_tokens: int = 128
    prefix_system: int = 1000
    prefix_user: int = 24
    prefix_trials: int = 5
    card_bytes: int = 24564 * MiB  # a 24 GB card: what an RTX 4090 reports
    card_seq_len: int = 2048
    card_tokens: int = 64
    card_run_max: int | None = None  # run at most this many of the sequences that fit
    format_tokens: int = 128
    # long prompts (--scenarios long): its own shape and engine, batch 1
    long_shape: str = "llama3.1-8b"
    long_contexts: tuple[int, ...] = (4096, 16384, 32768)
    long_user: int = 32  # the fresh user turn after a cached prefix
    long_tokens: int = 64  # decode tokens at each context
    long_batched_tokens: int = 8192  # prefill chunk: edge_llm.LLM's default
    long_kv_dtypes: tuple[str, ...] = ("auto", "fp8")  # --kv-cache-dtype picks one
    baseline_batches: tuple[int, ...] = (32, 64)
    baseline_compile: bool = True  # transformers' own default with the static cache
    budget_s: float | None = None  # wall-clock budget of the whole run (quick: device time)
    # rough seconds per scenario (a load of the checkpoint is added where one is needed)
    estimates: dict[str, float] = field(default_factory=dict)


PROFILES = {
    "full": Profile("full", shapes=("llama2-7b", "qwen2.5-7b")),
    "quick": Profile(
        "quick", shapes=("llama2-7b",), decode_tokens=128, offline_requests=64,
        offline_output=(64, 192), serve_min_requests=4, serve_tokens=48, prefix_trials=3,
        card_tokens=16, format_tokens=96, baseline_batches=(64,), budget_s=400.0,
        estimates=dict(build=25, load=60, decode=40, offline=45, gen64=25, prefix=15,
                       card24=30, baseline=120, serving=70, formats=40, long=150),
    ),
    "smoke": Profile(
        "smoke", shapes=("tiny-llama",), device="cpu", max_model_len=512,
        kv_cache_memory=64 * MiB, decode_prompt=16, decode_tokens=8, decode_batches=(1, 4),
        offline_requests=12, offline_prompt=(16, 64), offline_output=(4, 12), gen_seqs=8,
        gen_prompt=32, gen_tokens=8, serve_levels=(1, 4), serve_min_requests=4,
        serve_prompt=16, serve_tokens=8, prefix_system=96, prefix_user=8, prefix_trials=2,
        card_bytes=4 * MiB, card_seq_len=256, card_tokens=4, card_run_max=16, format_tokens=8,
        baseline_batches=(4, 8), baseline_compile=False, long_shape="tiny-llama3",
        long_contexts=(64, 192, 448), long_user=8, long_tokens=6, long_batched_tokens=256,
    ),
}


def profile_dict(p: Profile) -> dict[str, Any]:
    return asdict(p)


# ---- checkpoints ----------------------------------------------------------------------------


def ensure_checkpoint(shape: str, fmt: str, root: Path, device: str | None = None) -> Path:
    """A random-weight checkpoint of ``shape`` in ``fmt`` (group size 128) under ``root``,
    reused when a complete one is there (``.complete`` is written last)."""
    from random_checkpoint import SHAPES, make_random_checkpoint

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {sorted(SHAPES)}")
    out = root / f"{shape}-{fmt}-g128"
    marker = out / ".complete"
    if marker.is_file():
        log.info("checkpoint %s: reused", out)
        return out
    if out.exists():
        shutil.rmtree(out)  # a partial one from an interrupted run
    import torch

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    began = time.perf_counter()
    make_random_checkpoint(shape, fmt, out, group_size=128, device=dev)
    marker.write_text("ok\n")
    log.info("checkpoint %s: built in %.1f s (%.2f GB)", out, time.perf_counter() - began,
             checkpoint_bytes(out) / 1e9)
    return out


class Prebuilder:
    """Builds checkpoints needed later in a background process (CPU randomness, a few
    threads) while the GPU runs earlier scenarios; ``wait()`` before using them. A failed
    build leaves no ``.complete`` marker, so ``ensure_checkpoint`` builds it again."""

    def __init__(self, jobs: list[tuple[str, str]], root: Path, threads: int = 4) -> None:
        import subprocess

        self.proc = None
        todo = [(s, f) for s, f in jobs if not (root / f"{s}-{f}-g128" / ".complete").is_file()]
        if todo:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--build", str(root)]
            cmd += [f"{s}:{f}" for s, f in todo]
            env = envs.child_environ({envs.OMP_NUM_THREADS: str(threads),
                                      envs.CUDA_VISIBLE_DEVICES: ""})
            self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True)
            log.info("building %s in the background", todo)

    def wait(self) -> None:
        if self.proc is None:
            return
        _, err = self.proc.communicate()
        if self.proc.returncode != 0:
            log.warning("background build failed (rebuilt on demand): %s", err[-2000:])
        self.proc = None


def checkpoint_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def shape_config(shape: str) -> dict[str, Any]:
    from random_checkpoint import SHAPES

    return dict(SHAPES[shape])


# ---- prompts ---------------------------------------------------------------------------------


class PromptMaker:
    """Fresh random token-id prompts from one seeded stream: two calls never share a prefix
    (beyond chance), so the prefix cache cannot turn a measured prefill into a copy."""

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        if vocab_size < 8:
            raise ValueError(f"vocab_size must be >= 8, got {vocab_size}")
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)

    def ids(self, n: int) -> list[int]:
        # ids 0..2 are unk/bos/eos in the random checkpoints' tokenizers
        return [self.rng.randrange(3, self.vocab_size) for _ in range(n)]

    def batch(self, count: int, n: int) -> list[list[int]]:
        return [self.ids(n) for _ in range(count)]


def offline_workload(p: Profile, vocab_size: int, seed: int = 1) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) per request: lengths uniform in the profile's ranges."""
    rng = random.Random(seed)
    maker = PromptMaker(vocab_size, seed + 1000)
    work = []
    for _ in range(p.offline_requests):
        plen = rng.randint(*p.offline_prompt)
        work.append((maker.ids(plen), rng.randint(*p.offline_output)))
    return work


# ---- measurements -----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def copy_bandwidth(device: str, nbytes: int | None = None, reps: int = 10) -> dict[str, float]:
    """A large device-to-device copy: bytes read + written per second (GB/s)."""
    import torch

    nbytes = nbytes or (2 * GiB if device.startswith("cuda") else 64 * MiB)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    dst.copy_(src)
    synchronize(device)
    began = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    synchronize(device)
    seconds = time.perf_counter() - began
    del src, dst
    free_device_memory(device)
    return {"gb_per_s": 2 * nbytes * reps / seconds / 1e9, "bytes": nbytes, "reps": reps}


def decode_bytes_per_step(model, arch, batch: int, mean_context: float,
                          kv_elem_bytes: int) -> dict[str, float]:
    """Bytes one decode step of ``batch`` sequences must read at least: every weight tensor
    on the device (quantized words, scales, zeros, norms, lm_head), ``batch`` rows of the
    embedding table (the whole table when tied to lm_head), and each sequence's K and V
    over ``mean_context`` positions (a sliding-window layer's window at most). Rotary tables
    are left out (a few rows are read)."""
    seen: set[int] = set()
    embed = model.model.embed_tokens.weight
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    tied = head is not None and head.data_ptr() == embed.data_ptr()
    weights = 0
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    for name, t in tensors:
        if t is None or t.device.type == "meta" or "rotary" in name:
            continue
        ptr = t.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        if ptr == embed.data_ptr() and not tied:
            weights += batch * embed.shape[1] * embed.element_size()
        else:
            weights += t.numel() * t.element_size()
    # a sliding-window layer reads its window's keys at most
    contexts = [mean_context if arch.layer_window(i) is None
                else min(mean_context, arch.layer_window(i)) for i in range(arch.num_layers)]
    kv = batch * sum(contexts) * 2 * arch.num_kv_heads * arch.head_dim * kv_elem_bytes
    return {"weights": float(weights), "kv": float(kv), "total": float(weights + kv)}


def free_device_memory(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# ---- budget and results ------------------------------------------------------------------------


class Budget:
    """Wall-clock budget of a run: a scenario starts only if its estimate fits what is left."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.began = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.began

    def refusal(self, estimate: float) -> str | None:
        """None if ``estimate`` seconds fit; else why not (recorded as the skip reason)."""
        if self.seconds is None:
            return None
        left = self.seconds - self.elapsed()
        if estimate > left:
            return f"budget: {left:.0f} s left of {self.seconds:.0f} s, needs ~{estimate:.0f} s"
        return None


class Results:
    """One JSON file, rewritten after every change so a killed run still leaves its results."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {"meta": meta, "shapes": {}, "errors": [], "skipped": []}
        self.save()

    def shape(self, shape: str) -> dict[str, Any]:
        return self.data["shapes"].setdefault(shape, {})

    def put(self, shape: str, key: str, value: Any) -> None:
        self.shape(shape)[key] = value
        self.save()

    def skip(self, shape: str, scenario: str, reason: str) -> None:
        log.warning("%s / %s skipped: %s", shape, scenario, reason)
        self.data["skipped"].append({"shape": shape, "scenario": scenario, "reason": reason})
        self.save()

    def error(self, shape: str, scenario: str, exc: BaseException, tail: str) -> None:
        log.error("%s / %s failed: %r", shape, scenario, exc)
        self.data["errors"].append({"shape": shape, "scenario": scenario, "error": repr(exc),
                                    "traceback": tail})
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=_jsonable))
        tmp.replace(self.path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def setup_logging(out_dir: Path, name: str) -> Path:
    """Log to stdout and to ``out_dir/<name>.log`` (the engine's own loggers included)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.log"
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in (logging.StreamHandler(sys.stdout), logging.FileHandler(path, mode="w")):
        handler.setFormatter(fmt)
        root.addHandler(handler)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    return path


def environment() -> dict[str, Any]:
    """Versions and the device, for the results' ``meta``."""
    import platform

    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("transformers", "triton"):
        try:
            env[mod] = __import__(mod).__version__
        except ImportError:
            env[mod] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = props.name
        env["gpu_memory_gib"] = round(props.total_memory / GiB, 1)
    env["cpus"] = os.cpu_count()
    return env


if __name__ == "__main__":  # the Prebuilder's process: --build ROOT shape:fmt ...
    if len(sys.argv) < 4 or sys.argv[1] != "--build":
        raise SystemExit("usage: lib/e2e_common.py --build ROOT SHAPE:FORMAT [SHAPE:FORMAT ...]")
    import torch

    torch.set_num_threads(int(envs.OMP_NUM_THREADS.get() or "4"))
    for job in sys.argv[3:]:
        shape_name, fmt_name = job.split(":")
        ensure_checkpoint(shape_name, fmt_name, Path(sys.argv[2]), device="cpu")
