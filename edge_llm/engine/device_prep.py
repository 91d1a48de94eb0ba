"""Start-up work that needs no torch, begun on a daemon thread as soon as the device is known,
beside the imports of torch, litestar and the engine (which hold the GIL nearly throughout):

* the CUDA context: ``cuInit`` and the device's primary context through the driver API
  (ctypes releases the GIL around each call). The CUDA runtime under torch adopts that same
  primary context, so the loader's first allocation finds it ready instead of creating it.
* Triton's ``triton_key()``: a SHA-256 of its compiler sources and of ``libtriton.so`` (about
  500 MB) that Triton computes at its first kernel lookup in a process, warm cache or not:
  read from ``EDGE_LLM_CACHE_DIR`` where an earlier start stored it for this Triton, else
  computed and stored (triton_key.py says why and how).

Nothing else is touched before torch: in particular not ``triton.runtime.driver.active``,
which binds to torch's streams only when torch is imported first.

Only for a CUDA device (``cuda``, ``cuda:N``, or ``auto`` where the driver sees a GPU) and a
torch built with CUDA (a CPU build on a GPU machine serves on the CPU: no context held). A
failure here (no driver, no GPU, no Triton) is logged at debug level and changes nothing: the
same work then happens where it always did, and reports its own errors there.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from dataclasses import dataclass

from edge_llm import envs

from .triton_key import prime_triton_key

logger = logging.getLogger(__name__)

_CUDA_SUCCESS = 0


@dataclass
class PrepResult:
    """What the thread did: seconds each part took (None: not done), and why not."""

    device: str
    context_seconds: float | None = None
    triton_key_seconds: float | None = None
    triton_key_stored: bool | None = None  # the key read from the cache folder
    skipped: str = ""


class DevicePrep:
    """The preparation thread of one process (``start_device_prep`` makes it once)."""

    def __init__(self, device: str) -> None:
        self.result = PrepResult(device)
        self._context = ctypes.c_void_p()  # retained for the life of the process
        self._thread = threading.Thread(target=self._run, name="edge-llm-device-prep",
                                        daemon=True)
        self.began = time.perf_counter()
        self._thread.start()

    def join(self, timeout: float | None = None) -> PrepResult:
        """The result once the thread is done (or as far as it got within ``timeout``)."""
        self._thread.join(timeout)
        return self.result

    def _run(self) -> None:
        try:
            ordinal = cuda_ordinal(self.result.device)
            if ordinal is None:
                self.result.skipped = "not a CUDA device"
                return
            if not torch_built_with_cuda():  # auto on a CPU build: no context to hold
                self.result.skipped = "torch is not built with CUDA"
                return
            began = time.perf_counter()
            why = self._retain_primary_context(ordinal)
            if why:
                self.result.skipped = why
                return
            self.result.context_seconds = time.perf_counter() - began
            if envs.KERNELS.get() == "torch" or envs.TRITON_INTERPRET.get():
                return  # no compiled Triton kernels in this process
            began = time.perf_counter()
            self.result.triton_key_stored = prime_triton_key(envs.CACHE_DIR.get())
            self.result.triton_key_seconds = time.perf_counter() - began
        except Exception as exc:  # noqa: BLE001 - an optimisation only: the normal path reports
            self.result.skipped = f"{type(exc).__name__}: {exc}"
        finally:
            logger.debug("device prep: %s", self.result)

    def _retain_primary_context(self, ordinal: int) -> str:
        """cuInit, then retain device ``ordinal``'s primary context; '' or why not."""
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return "no CUDA driver"
        if cuda.cuInit(0) != _CUDA_SUCCESS:
            return "cuInit failed"
        count = ctypes.c_int(0)
        if cuda.cuDeviceGetCount(ctypes.byref(count)) != _CUDA_SUCCESS or count.value <= ordinal:
            return f"no CUDA device {ordinal}"
        device = ctypes.c_int(0)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != _CUDA_SUCCESS:
            return f"no CUDA device {ordinal}"
        if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(self._context), device) != _CUDA_SUCCESS:
            return "the primary context could not be created"
        return ""


def torch_built_with_cuda() -> bool:
    """Whether the installed torch is a CUDA build, read from its ``version.py`` without
    importing it (``cuda = None`` in CPU and ROCm builds); False where that cannot be read."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torch")  # the top-level package: nothing is imported
    if spec is None or spec.origin is None:
        return False
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return False
    found = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(.+)$", text, re.MULTILINE)
    return found is not None and found.group(1).strip() != "None"


def cuda_ordinal(device: str) -> int | None:
    """The CUDA device index ``device`` (a ``--device`` value) names; None for anything else.
    ``auto`` is device 0 (the prep finds out whether there is one)."""
    text = device.strip().lower()
    if text in ("auto", "cuda"):
        return 0
    match = re.fullmatch(r"cuda:(\d+)", text)
    return int(match.group(1)) if match else None


_lock = threading.Lock()
_prep: DevicePrep | None = None


def start_device_prep(device: str) -> DevicePrep:
    """Start the preparation for ``device`` once per process (later calls return the first);
    returns at once."""
    global _prep
    with _lock:
        if _prep is None:
            _prep = DevicePrep(device)
        return _prep


def device_prep() -> DevicePrep | None:
    """The process's preparation, if one was started."""
    return _prep
