"""The checkpoint files a model folder names, kept inside that folder (no torch import: the
prefetch reads this before torch loads).

``model.safetensors.index.json`` maps tensor names to shard file names; a hostile or broken
index could name ``../../etc/passwd`` or an absolute path. Every name must be a plain relative
path that resolves inside the folder (symbolic links included, so a shard linked out of the
folder is refused too).
"""

from __future__ import annotations

import json
from pathlib import Path

INDEX_FILE = "model.safetensors.index.json"


class CheckpointIndexError(ValueError):
    """An index file that cannot be used: invalid JSON, no weight_map, or a shard path that
    leaves the model folder. The message names the file and the value."""


def shard_path(folder: Path, name: object, index: Path) -> Path:
    """``folder / name`` when ``name`` stays inside ``folder``; CheckpointIndexError else."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise CheckpointIndexError(f"{index}: weight_map names a shard {name!r}, not a file "
                                   "name.")
    root = folder.resolve()
    path = (folder / name).resolve()
    if Path(name).is_absolute() or ".." in Path(name).parts or not path.is_relative_to(root):
        raise CheckpointIndexError(f"{index}: weight_map names the shard {name!r}, which is "
                                   f"outside the model folder {folder}; refused.")
    return folder / name


def indexed_shards(folder: Path) -> list[Path] | None:
    """The shard files ``model.safetensors.index.json`` names (sorted, each once), or None
    when there is no index; CheckpointIndexError for an unusable one."""
    index = folder / INDEX_FILE
    if not index.is_file():
        return None
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointIndexError(f"{index}: invalid JSON: {exc}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointIndexError(f"{index}: no 'weight_map' object.")
    return sorted({shard_path(folder, name, index) for name in weight_map.values()})
