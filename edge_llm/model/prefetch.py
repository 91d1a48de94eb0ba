"""Read a checkpoint into the page cache in the background while the server imports torch.

A serverless platform's scale-from-zero start finds the page cache empty: the weights come
off the disk, and the loader only starts once torch and the engine are imported (seconds).
From a dropped page cache the weight load takes about three times as long as from a warm one
(BENCHMARKS.md, "Cold start"). ``start_prefetch`` asks
the kernel to read the checkpoint's safetensors files (``posix_fadvise(WILLNEED)``: no copy
into Python, the GIL released), then the compile cache's files, on a daemon thread, as
soon as ``edge-llm serve`` knows the model; the staged reads then find the bytes in memory.

No torch here (this runs before torch is imported). Only files already on local disk are
prefetched: a local folder, a hub model already in the HF cache, the demo model once built.
Nothing is read when the files exceed half of the memory the process can use (the page
cache would evict what it read first), or on a system without ``posix_fadvise``. Reading every
byte on the thread instead of advising was measured too: it halves the weight load but slows
the imports more, for no gain at start-up (BENCHMARKS.md, "Cold start").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from .shards import indexed_shards

logger = logging.getLogger(__name__)


def checkpoint_files(model: str | None, revision: str | None = None) -> list[Path]:
    """The model's ``*.safetensors`` files on local disk (none if it is not there yet)."""
    folder = _local_folder(model, revision)
    if folder is None:
        return []
    try:
        files = indexed_shards(folder)
        if files is None:
            files = sorted(folder.glob("*.safetensors"))
    except (OSError, ValueError):  # CheckpointIndexError: a shard outside the folder too
        return []  # the loader reports a broken checkpoint properly
    return [f for f in files if f.is_file()]


def _local_folder(model: str | None, revision: str | None) -> Path | None:
    if model is None:
        from .demo import demo_model_dir

        folder = demo_model_dir()
        return folder if folder.is_dir() else None
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") != 1:
        return None
    try:  # a hub id: its snapshot in the HF cache, without the network
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, revision=revision, local_files_only=True))
    except Exception:  # not cached (the loader downloads it), or no huggingface_hub
        return None


def cache_files(root: Path) -> list[Path]:
    """Every file under ``root`` (the compile cache), smallest first."""
    if not root.is_dir():
        return []
    files = [p for p in root.rglob("*") if p.is_file()]
    return sorted(files, key=lambda p: p.stat().st_size)


def memory_room() -> int | None:
    """Bytes the process may still fill: the cgroup's limit less its usage (containers), else
    MemAvailable; None if neither can be read."""
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            return max(int(limit) - int((cgroup / "memory.current").read_text()), 0)
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def prefetch(files: list[Path]) -> int:
    """Ask the kernel to read ``files`` into the page cache (blocks while it queues the reads;
    nothing where ``posix_fadvise`` is missing). Returns the bytes covered."""
    if not hasattr(os, "posix_fadvise"):
        return 0
    done = 0
    for file in files:
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            done += os.fstat(fd).st_size
        except OSError:
            pass
        finally:
            os.close(fd)
    return done


def prefetch_model(model: str | None, revision: str | None = None,
                   compile_cache: Path | None = None) -> tuple[int, int]:
    """Prefetch the checkpoint, then ``compile_cache``'s files, if the checkpoint is on local
    disk and fits half the memory room; returns (checkpoint bytes, cache bytes) asked for,
    (0, -1) when the checkpoint does not fit."""
    weights = checkpoint_files(model, revision)
    if not weights:
        return 0, 0
    total = sum(f.stat().st_size for f in weights)
    room = memory_room()
    if room is not None and total > room // 2:
        logger.info("Prefetch: not reading the checkpoint, %.1f GB against %.1f GB of memory "
                    "room", total / 1e9, room / 1e9)
        return 0, -1
    read = prefetch(weights)
    cached = prefetch(cache_files(compile_cache)) if compile_cache is not None else 0
    return read, cached


def start_prefetch(model: str | None, revision: str | None = None,
                   compile_cache: Path | None = None) -> threading.Thread | None:
    """``prefetch_model`` on a daemon thread (finding a hub model's snapshot imports
    huggingface_hub: not on the caller's time); None without ``posix_fadvise``."""
    if not hasattr(os, "posix_fadvise"):
        return None

    def run() -> None:
        began = time.perf_counter()
        try:
            weights, kernels = prefetch_model(model, revision, compile_cache)
        except Exception as exc:  # an optimisation only: the load reads the files anyway
            logger.debug("prefetch failed: %s: %s", type(exc).__name__, exc)
            return
        if weights:
            logger.info("Prefetch: %.2f GB of checkpoint and %.0f MB of compiled kernels "
                        "into the page cache in %.2f s", weights / 1e9, kernels / 1e6,
                        time.perf_counter() - began)
        elif kernels == 0:
            logger.info("Prefetch: nothing read (the checkpoint is not on local disk yet)")

    thread = threading.Thread(target=run, name="edge-llm-prefetch", daemon=True)
    thread.start()
    return thread
