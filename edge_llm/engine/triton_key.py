"""Triton's source key kept on disk, so that a start does not hash Triton again.

Triton names every kernel in its cache by ``triton_key()``: a SHA-256 of its compiler and
language sources and of ``libtriton.so`` (about 500 MB), computed once per process at the first
kernel lookup, warm cache or not. Computed on the device-prep thread beside the imports
(device_prep.py), it took 2.48 s of a 2.55 s import phase on one H100 host and 2.95-3.89 s on
others, against about 0.4 s alone: it reads the library in 1 MB chunks and, while torch imports
on the main thread, waits for the GIL after each one (up to the 5 ms switch interval, ~480
times). Stored, it takes 0.3-0.9 s there (BENCHMARKS.md, "Cold start").

The value depends only on the bytes of those files. It is stored in
``EDGE_LLM_CACHE_DIR/triton_key.json`` with a fingerprint of those files: each one's path, size
and modification time, the way Python checks its own bytecode caches.
A later start with the same fingerprint installs the stored value as ``triton_key`` in the Triton
modules that hold the function. Triton's own compile-warmup workers install a known key the same
way (``triton/_compile_warmup_pool.py``). A different fingerprint, or a missing or unreadable
file, computes the key and stores it again. A cache folder that cannot be written costs only
the hash.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from .cache_record import read_record, write_record

logger = logging.getLogger(__name__)

FILE_NAME = "triton_key.json"


def key_functions() -> list[Callable[[], str]]:
    """Triton's ``triton_key``: in ``triton.runtime.cache`` (3.2 and later), in
    ``triton.compiler.compiler`` before; each distinct one found (compile uses its own)."""
    found: list = []
    for name in ("triton.runtime.cache", "triton.compiler.compiler"):
        try:
            func = getattr(importlib.import_module(name), "triton_key", None)
        except ImportError:
            continue
        if callable(func) and func not in found:
            found.append(func)
    return found


def triton_root() -> Path | None:
    """The installed Triton package's folder (nothing imported), or None."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


# the packages whose modules triton_key hashes, beside runtime/cache.py and _C/libtriton
HASHED_PACKAGES = ("compiler", "backends", "language")


def hashed_files(root: Path) -> list[Path]:
    """The files under Triton's folder ``root`` that its key is computed from (``triton_key``
    in runtime/cache.py): that module, the native library, the package's ``__init__`` (its
    version) and the modules of the compiler, backends and language packages, descending into
    subpackages only, as ``pkgutil.walk_packages`` does (not the headers and tools beside
    them: the fewer files, the fewer waits for the GIL while torch imports)."""
    files = [root / "__init__.py", root / "runtime" / "cache.py",
             *sorted((root / "_C").glob("libtriton*"))]
    for package in HASHED_PACKAGES:
        for folder, dirs, names in os.walk(root / package):
            dirs[:] = sorted(d for d in dirs if Path(folder, d, "__init__.py").is_file())
            files += [Path(folder, n) for n in sorted(names) if n.endswith((".py", ".so"))]
    return files


def fingerprint(root: Path) -> str:
    """sha256 over (relative path, size, modification time) of ``hashed_files(root)``: any
    change to the files Triton's key reads changes it."""
    digest = hashlib.sha256()
    for path in hashed_files(root):
        try:
            stat = path.stat()
        except OSError:
            continue  # absent in this version (the list names what may be there)
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
                      .encode())
    return digest.hexdigest()


def _stored(path: Path, files: str) -> str | None:
    saved = read_record(path)
    if saved is None or saved.get("fingerprint") != files:
        return None
    key = saved.get("triton_key")
    return key if isinstance(key, str) and key else None


def _store(path: Path, files: str, key: str) -> None:
    """Written whole or not at all (``write_record``)."""
    try:
        write_record(path, {"fingerprint": files, "triton_key": key})
    except OSError as exc:
        logger.debug("Triton's key not stored in %s: %s", path, exc)


def _install(key: str, originals: list[Callable[[], str]]) -> None:
    """``triton_key`` returns ``key`` in every loaded Triton module that holds the original."""

    def stored_triton_key() -> str:
        return key

    for name, module in list(sys.modules.items()):
        if (name == "triton" or name.startswith("triton.")) and module is not None:
            if getattr(module, "triton_key", None) in originals:
                module.triton_key = stored_triton_key


def prime_triton_key(cache_root: Path) -> bool | None:
    """Make Triton's key ready for this process: stored in ``cache_root`` for this Triton
    (True), else computed and stored (False); None where no Triton is installed."""
    originals = key_functions()
    if not originals:
        return None
    root = triton_root()
    files = fingerprint(root) if root is not None else ""
    path = Path(cache_root) / FILE_NAME
    key = _stored(path, files) if files else None
    if key is not None:
        _install(key, originals)
        return True
    keys = {func() for func in originals}
    if len(keys) == 1 and files:  # one value to keep (two functions: keep neither)
        _store(path, files, keys.pop())
    return False
