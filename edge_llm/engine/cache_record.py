"""One small JSON record in the compile-cache folder (``EDGE_LLM_CACHE_DIR``), as the start-up
probes' results (probe_cache.py) and Triton's stored key (triton_key.py) keep theirs: read
back as a JSON object or nothing, written whole or not at all. The callers validate the
fields. No torch here: Triton's key is read before torch is imported."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def read_record(path: Path) -> dict[str, Any] | None:
    """The JSON object stored at ``path``; None if absent, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_record(path: Path, record: Mapping[str, Any], **dump: Any) -> None:
    """Store ``record`` at ``path`` (``json.dump`` keywords in ``dump``): written to a temporary
    file beside it, then renamed over it, so a reader sees the old record or the new one.
    Raises OSError (the temporary file removed) when the folder cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, **dump)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
