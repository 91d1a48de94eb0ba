"""Read safetensors files straight into device memory through pinned host buffers.

The memory-mapped path (``weights.iter_tensors``) copies from pageable pages tensor by
tensor, so a 4 GB checkpoint reaches the GPU at about half of what the disk and PCIe allow.
Here each file's tensor data is read in large chunks by a few threads (``os.preadv`` releases
the GIL), each into its own pinned buffer, and copied asynchronously into one device blob per
file; the tensors are views of that blob::

    file:  | 8-byte length | JSON header | data: tensor bytes at their data_offsets ... |
    blob:                                | the data section, one uint8 device tensor    |
    tensor = blob[begin:end].view(dtype).view(shape)

Contract: a yielded tensor shares the blob of its file, so whoever keeps one must copy it
(``torch.Tensor.clone``); the blob is freed when no view of it is left. The loader converts
each file's tensors before reading the next, so peak device memory is the model plus one
file's data; ``fits_staged`` says whether the device has room for that, and the loader falls
back to the mapped path when it has not.

Works on CPU too (plain host buffers, synchronous copies), which is how the CPU tests cover it.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

MiB = 1 << 20
CHUNK_BYTES = 64 * MiB
THREADS = 4
_TORCH_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}


def read_header(file: Path) -> tuple[int, list[tuple[str, torch.dtype, list[int], int, int]]]:
    """(offset of the data section, [(name, dtype, shape, begin, end)] in data order).

    The caller has validated the file (``weights.validate_safetensors``); a dtype this reader
    does not map raises ValueError naming the tensor."""
    with open(file, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _TORCH_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"Tensor {name!r} in {file.name} has dtype {info['dtype']}, "
                             f"which the loader does not read.")
        begin, end = info["data_offsets"]
        entries.append((name, dtype, list(info["shape"]), begin, end))
    entries.sort(key=lambda e: e[3])
    return 8 + header_len, entries


def fits_staged(total_bytes: int, largest_file: int, device: torch.device,
                margin: float = 0.9) -> bool:
    """Whether the device can hold the converted model plus the largest file's buffer (the
    loader converts and frees one file at a time) within ``margin`` of its free memory.
    Always True on CPU."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return total_bytes + largest_file <= margin * free


class _Buffers:
    """One reusable host buffer per reader thread (pinned on CUDA) and, on CUDA, a stream and
    an event per buffer so a buffer is refilled only after its last copy has left it."""

    def __init__(self, device: torch.device, chunk: int) -> None:
        self.cuda = device.type == "cuda"
        self.chunk = chunk
        self.local = threading.local()

    def get(self):
        slot = getattr(self.local, "slot", None)
        if slot is None:
            buf = torch.empty(self.chunk, dtype=torch.uint8, pin_memory=self.cuda)
            stream = torch.cuda.Stream() if self.cuda else None
            slot = self.local.slot = [buf, memoryview(buf.numpy()), stream, None]
        return slot


def _read_into(fd: int, view: memoryview, offset: int, n: int, file: Path) -> None:
    got = 0
    while got < n:
        step = os.preadv(fd, [view[got:n]], offset + got)
        if step <= 0:
            raise OSError(f"{file}: unexpected end of file at byte {offset + got}")
        got += step


def read_file(file: Path, device: torch.device, chunk: int = CHUNK_BYTES,
              threads: int = THREADS) -> tuple[torch.Tensor, list]:
    """The data section of ``file`` as one uint8 tensor on ``device``, and its header entries
    (``read_header``). Chunks of ``chunk`` bytes are read by up to ``threads`` threads."""
    data_start, entries = read_header(file)
    size = max((e[4] for e in entries), default=0)
    blob = torch.empty(size, dtype=torch.uint8, device=device)
    buffers = _Buffers(device, chunk)

    def copy_chunk(offset: int) -> None:
        n = min(chunk, size - offset)
        buf, view, stream, done = buffers.get()
        if done is not None:
            done.synchronize()  # this buffer's previous copy has left it
        _read_into(fd, view, data_start + offset, n, file)
        if stream is None:
            blob[offset:offset + n].copy_(buf[:n])
            return
        with torch.cuda.stream(stream):
            blob[offset:offset + n].copy_(buf[:n], non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        buffers.get()[3] = event

    fd = os.open(file, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, data_start, size, os.POSIX_FADV_SEQUENTIAL)
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            list(pool.map(copy_chunk, range(0, size, chunk)))
    finally:
        os.close(fd)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the copies ran on side streams
    return blob, entries


def tensor_views(blob: torch.Tensor, entries: list) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for each header entry, a view of ``blob`` (a copy when its offset is not
    aligned to its element size, which ``view(dtype)`` cannot express)."""
    for name, dtype, shape, begin, end in entries:
        raw = blob[begin:end]
        if begin % dtype.itemsize:
            raw = raw.clone()
        yield name, raw.view(dtype).view(shape)


def iter_tensors_staged(files: list[Path], device: torch.device, chunk: int = CHUNK_BYTES,
                        threads: int = THREADS) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of ``files`` on ``device``, file by file (see the module's contract)."""
    for file in files:
        blob, entries = read_file(file, device, chunk, threads)
        yield from tensor_views(blob, entries)
        del blob
