"""Checkpoint files: find them (local folder or hub), validate them, iterate their tensors.

Every file's header is checked against its size before any tensor is read, so a corrupt or
truncated download is refused with the file's name instead of leaving a half-loaded model.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from edge_llm import envs

from .shards import indexed_shards

HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]
_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8,
}


class ModelNotFoundError(FileNotFoundError):
    pass


class CorruptCheckpointError(ValueError):
    pass


def resolve_model_path(model: str, revision: str | None = None) -> Path:
    """A local folder as is; otherwise a hub id downloaded into the normal HF cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"Model folder {path} has no config.json.")
        return path
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise ModelNotFoundError(f"Model path {model!r} is not a folder with config.json.")
    return _download(model, revision)


def _download(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS)
        )
    except Exception as exc:  # offline, missing repo, gated, network: one clear message
        offline = envs.HF_HUB_OFFLINE.get()
        reason = "HF_HUB_OFFLINE is set" if offline else f"{type(exc).__name__}: {exc}"
        raise ModelNotFoundError(
            f"Could not get model {repo_id!r} from the Hugging Face hub ({reason}). "
            f"Pass a local folder holding config.json and *.safetensors, or run "
            f"`huggingface-cli download {repo_id}` on a machine that is online "
            f"(set HF_TOKEN for gated models) and point HF_HOME at that cache."
        ) from None


def checkpoint_files(path: Path) -> list[Path]:
    files = indexed_shards(path)
    if files is None:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(
            f"No *.safetensors weights in {path} (.bin/.pt checkpoints are not loaded: "
            f"convert them with safetensors first)."
        )
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise CorruptCheckpointError(f"Checkpoint shards missing in {path}: {missing}.")
    return files


def validate_safetensors(file: Path) -> tuple[int, list[str]]:
    """Check the header against the file size; return (bytes of tensor data, tensor names)."""
    size = file.stat().st_size
    try:
        with open(file, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > size - 8 or header_len > 100_000_000:
                raise ValueError(f"header length {header_len} exceeds the file size {size}")
            header = json.loads(f.read(header_len))
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(f"Corrupt safetensors file {file}: {exc}") from None
    end, names = 0, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, stop = info["data_offsets"]
        numel = 1
        for dim in info["shape"]:
            numel *= dim
        if stop - begin != numel * _DTYPE_BYTES.get(info["dtype"], 0):
            raise CorruptCheckpointError(f"Corrupt safetensors file {file}: tensor {name}.")
        end = max(end, stop)
        names.append(name)
    if 8 + header_len + end > size:
        raise CorruptCheckpointError(
            f"Truncated safetensors file {file}: needs {8 + header_len + end} bytes, "
            f"has {size}."
        )
    return end, names


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Memory-mapped tensors, file by file (each stays a view of the mapping until moved)."""
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)

