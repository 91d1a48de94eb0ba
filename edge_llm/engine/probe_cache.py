"""The start-up memory probes' results kept on disk, so that a second start of the same model
with the same settings skips them.

The KV plan needs two measurements (startup_probes.py): the peak memory of a whole
``max_num_batched_tokens`` step and the memory the CUDA graphs will hold. Taking them costs a
scratch forward of every token of a step and a capture of the largest graphs: seconds of a
7B model's start (BENCHMARKS.md, "Cold start"), on every scale-from-zero start.
They depend only on what the key holds: the model's architecture and weight bytes, the
dtypes, the scheduler and cache settings, the graph sizes, the GPU, the library versions,
this package's source and the ``EDGE_LLM_*`` / allocator environment. The results are stored
under ``EDGE_LLM_CACHE_DIR/probes/`` (beside the compiled kernels, so a platform's cache
volume keeps both); ``EDGE_LLM_PROBE_CACHE=0`` measures at every start. A missing, unreadable
or mismatched file is measured again and rewritten.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from edge_llm import envs

from .cache_record import read_record, write_record

logger = logging.getLogger(__name__)

FIELDS = ("peak_bytes", "graph_bytes")
# settings that do not change what the probes measure
IGNORED_ENV = frozenset({"EDGE_LLM_CACHE_DIR", "EDGE_LLM_PORT", "EDGE_LLM_HOST",
                         "EDGE_LLM_MODEL", "EDGE_LLM_API_KEY", "EDGE_LLM_LOG_LEVEL",
                         envs.PROBE_CACHE.name})


def probe_cache_wanted() -> bool:
    """On unless ``EDGE_LLM_PROBE_CACHE=0``; any value but a switch is an error."""
    return envs.PROBE_CACHE.get()


def probe_dir() -> Path:
    from edge_llm.model.demo import cache_dir

    return cache_dir() / "probes"


@functools.cache
def source_digest() -> str:
    """sha256 of this package's Python files (kernels and quant included): any change to
    the code the probes run measures again."""
    import edge_llm.kernels
    import edge_llm.quant

    digest = hashlib.sha256()
    package = Path(__file__).parents[1]  # edge_llm/ (this file is edge_llm/engine/probe_cache.py)
    roots = {package} | {Path(m.__file__).parent for m in (edge_llm.kernels, edge_llm.quant)}
    for root in sorted(roots):
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def probe_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that may change what the probes measure."""
    found = {k: v for k, v in envs.edge_llm_variables(environ).items() if k not in IGNORED_ENV}
    for var in (envs.PYTORCH_CUDA_ALLOC_CONF, envs.PYTORCH_ALLOC_CONF):
        if var.is_set(environ):
            found[var.name] = var.raw(environ)
    return dict(sorted(found.items()))


def probe_key(parts: Mapping[str, Any]) -> str:
    """A file-name-safe digest of ``parts`` (JSON-serialisable; ``str`` for the rest)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load(key: str, folder: Path | None = None) -> dict[str, int] | None:
    """The stored results for ``key``, or None (none stored, unreadable, or malformed)."""
    data = read_record((folder or probe_dir()) / f"{key}.json")
    if data is None or data.get("key") != key:
        return None
    values = {f: data.get(f) for f in FIELDS}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
               for v in values.values()):
        return None
    return values


def save(key: str, values: Mapping[str, int], parts: Mapping[str, Any],
         folder: Path | None = None) -> Path | None:
    """Store ``values`` for ``key`` (atomically: a file written aside, then renamed); the
    key's parts go in too, for a person reading it. None if the folder cannot be written."""
    path = (folder or probe_dir()) / f"{key}.json"
    try:
        write_record(path, {"key": key, **{f: int(values[f]) for f in FIELDS}, "parts": parts},
                     indent=1, sort_keys=True, default=str)
    except OSError as exc:
        logger.debug("probe cache not written (%s: %s)", type(exc).__name__, exc)
        return None
    return path


def cached_probes(parts: Mapping[str, Any], measure: Callable[[], dict[str, int]],
                  folder: Path | None = None) -> tuple[dict[str, int], bool]:
    """The probes' results for ``parts``: stored ones if there are, else ``measure()``'s,
    stored for the next start. Returns (results, whether they were stored ones)."""
    if not probe_cache_wanted():
        return measure(), False
    key = probe_key(parts)
    found = load(key, folder)
    if found is not None:
        return found, True
    values = measure()
    save(key, values, parts, folder)
    return values, False
