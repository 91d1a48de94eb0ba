"""The start-up's device preparation (edge_llm/engine/device_prep.py): which ``--device``
values it prepares, the driver calls that create the primary context, Triton's key computed
beside them or read back from the cache folder (edge_llm/engine/triton_key.py), nothing at all
for a CPU, and the ``cuda_context`` / ``kernel_warmup`` phases it and the runner give the
start-up log. A fake driver stands in for libcuda (no GPU here)."""

from __future__ import annotations

import ctypes
import json
import os
import sys
from types import SimpleNamespace

import pytest

from edge_llm.engine import device_prep, triton_key
from edge_llm.server.hooks import StartupPhases


class FakeDriver:
    """libcuda's four calls the preparation makes, with ``devices`` GPUs."""

    def __init__(self, devices: int, retain_result: int = 0) -> None:
        self.devices = devices
        self.retain_result = retain_result
        self.calls: list[tuple] = []

    def cuInit(self, flags):  # noqa: N802 - the driver's names
        self.calls.append(("cuInit", flags))
        return 0

    def cuDeviceGetCount(self, ref):  # noqa: N802
        ref._obj.value = self.devices
        self.calls.append(("cuDeviceGetCount",))
        return 0

    def cuDeviceGet(self, ref, ordinal):  # noqa: N802
        ref._obj.value = 100 + ordinal  # a handle, not the ordinal
        self.calls.append(("cuDeviceGet", ordinal))
        return 0

    def cuDevicePrimaryCtxRetain(self, ref, device):  # noqa: N802
        ref._obj.value = 0xC0
        self.calls.append(("cuDevicePrimaryCtxRetain", device.value))
        return self.retain_result


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """No preparation started yet in this process; Triton's hash is a stub that counts; an
    empty cache folder."""
    monkeypatch.setattr(device_prep, "_prep", None)
    monkeypatch.setenv("EDGE_LLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(device_prep, "torch_built_with_cuda", lambda: True)
    hashed = []
    fake_cache = SimpleNamespace(triton_key=lambda: hashed.append(1) or "key")
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", fake_cache)
    monkeypatch.setitem(sys.modules, "triton.compiler.compiler", SimpleNamespace())
    monkeypatch.delenv("EDGE_LLM_KERNELS", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return hashed


def with_driver(monkeypatch, driver: FakeDriver | None) -> list[str]:
    opened: list[str] = []
    real = ctypes.CDLL

    def cdll(name, *args, **kwargs):
        if name != "libcuda.so.1":  # torch's own libraries, should it load meanwhile
            return real(name, *args, **kwargs)
        opened.append(name)
        if driver is None:
            raise OSError(f"{name}: cannot open shared object file")
        return driver

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    return opened


@pytest.mark.parametrize(("device", "ordinal"), [
    ("auto", 0), ("cuda", 0), ("CUDA", 0), ("cuda:3", 3), ("cpu", None), ("mps", None),
    ("cuda:x", None),
])
def test_which_devices_it_prepares(device, ordinal):
    assert device_prep.cuda_ordinal(device) == ordinal


def test_a_cuda_device_gets_its_primary_context_and_triton_hash(fresh, monkeypatch):
    driver = FakeDriver(devices=2)
    with_driver(monkeypatch, driver)
    prep = device_prep.start_device_prep("cuda:1")
    result = prep.join(timeout=10)
    assert driver.calls == [("cuInit", 0), ("cuDeviceGetCount",), ("cuDeviceGet", 1),
                            ("cuDevicePrimaryCtxRetain", 101)]
    assert result.skipped == "" and result.context_seconds is not None
    assert fresh == [1] and result.triton_key_seconds is not None
    # once per process: a second start (the app's factory after `edge-llm serve`) reuses it
    assert device_prep.start_device_prep("cuda:0") is prep and device_prep.device_prep() is prep
    assert len(driver.calls) == 4


def test_a_second_start_reads_tritons_key_instead_of_hashing(fresh, monkeypatch, tmp_path,
                                                              caplog):
    with_driver(monkeypatch, FakeDriver(devices=1))
    cache = sys.modules["triton.runtime.cache"]
    original = cache.triton_key
    first = device_prep.start_device_prep("cuda").join(timeout=10)
    assert fresh == [1] and first.triton_key_stored is False
    assert json.loads((tmp_path / "triton_key.json").read_text())["triton_key"] == "key"
    monkeypatch.setattr(device_prep, "_prep", None)  # the next process
    second = device_prep.start_device_prep("cuda").join(timeout=10)
    assert fresh == [1] and second.triton_key_stored is True  # not hashed again
    assert cache.triton_key is not original and cache.triton_key() == "key"
    with caplog.at_level("INFO", logger="edge_llm.server"):
        StartupPhases().record_device_prep(second)
    assert "Triton's key read from the cache folder in" in caplog.text


def test_tritons_key_is_hashed_again_when_its_files_change(fresh, monkeypatch, tmp_path):
    """A different fingerprint (Triton upgraded), an unreadable file or another value in it:
    hashed again and stored over it."""
    with_driver(monkeypatch, FakeDriver(devices=1))
    stored = tmp_path / "triton_key.json"
    cache = sys.modules["triton.runtime.cache"]
    original = cache.triton_key

    def start() -> bool | None:
        monkeypatch.setattr(device_prep, "_prep", None)
        cache.triton_key = original
        return device_prep.start_device_prep("cuda").join(timeout=10).triton_key_stored

    assert start() is False and start() is True and fresh == [1]
    monkeypatch.setattr(triton_key, "fingerprint", lambda root: "another Triton")
    assert start() is False and fresh == [1, 1]
    assert json.loads(stored.read_text())["fingerprint"] == "another Triton"
    for text in ("{not json", '["a list"]', '{"fingerprint": "another Triton"}'):
        stored.write_text(text)
        assert start() is False
    assert len(fresh) == 5 and start() is True


def test_the_fingerprint_sees_every_file_tritons_key_reads(tmp_path):
    """The native library, runtime/cache.py and the modules of the compiler, backends and
    language packages (subpackages included); not headers, tools or bytecode caches."""
    root = tmp_path / "triton"
    files = {"_C/libtriton.so": b"x" * 10, "runtime/cache.py": b"def triton_key(): ...",
             "__init__.py": b"__version__ = '3.6.0'", "compiler/__init__.py": b"",
             "compiler/compiler.py": b"A = 1", "backends/__init__.py": b"",
             "backends/nvidia/__init__.py": b"", "backends/nvidia/driver.py": b"B = 2",
             "backends/nvidia/include/cuda.h": b"/* a header */", "tools/disasm.py": b"",
             "compiler/__pycache__/compiler.cpython-312.pyc": b"bytecode"}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    read = {str(p.relative_to(root)) for p in triton_key.hashed_files(root)}
    assert read == {"_C/libtriton.so", "runtime/cache.py", "__init__.py", "compiler/__init__.py",
                    "compiler/compiler.py", "backends/__init__.py", "backends/nvidia/__init__.py",
                    "backends/nvidia/driver.py"}
    before = triton_key.fingerprint(root)
    for ignored in ("backends/nvidia/include/cuda.h", "tools/disasm.py",
                    "compiler/__pycache__/compiler.cpython-312.pyc"):
        (root / ignored).write_bytes(b"changed, and longer than before")
    assert triton_key.fingerprint(root) == before
    seen = {before}
    (root / "_C/libtriton.so").write_bytes(b"y" * 11)  # the library rebuilt
    seen.add(triton_key.fingerprint(root))
    os.utime(root / "backends/nvidia/driver.py", ns=(0, 12345))  # touched, same size
    seen.add(triton_key.fingerprint(root))
    (root / "language/extra").mkdir(parents=True)  # a new subpackage
    (root / "language/__init__.py").write_bytes(b"")
    (root / "language/extra/__init__.py").write_bytes(b"")
    seen.add(triton_key.fingerprint(root))
    assert len(seen) == 4


def test_the_real_tritons_key_round_trips(tmp_path, monkeypatch):
    """With the installed Triton: computed and stored, then read back as the same value in
    every module that holds the function (``triton.runtime.cache`` names its kernels by it)."""
    cache = pytest.importorskip("triton.runtime.cache")
    original = cache.triton_key
    holders = [m for name, m in list(sys.modules.items())
               if name.startswith("triton") and getattr(m, "triton_key", None) is original]
    for module in holders:  # put back after the test
        monkeypatch.setattr(module, "triton_key", original)
    assert triton_key.prime_triton_key(tmp_path) is False
    assert cache.triton_key is original
    assert triton_key.prime_triton_key(tmp_path) is True
    assert all(m.triton_key is not original for m in holders)
    assert all(m.triton_key() == original() for m in holders)


def test_a_cpu_touches_no_driver(fresh, monkeypatch):
    opened = with_driver(monkeypatch, FakeDriver(devices=1))
    result = device_prep.start_device_prep("cpu").join(timeout=10)
    assert opened == [] and fresh == []
    assert result.context_seconds is None and result.skipped == "not a CUDA device"


@pytest.mark.parametrize(("driver", "device", "why"), [
    (None, "auto", "no CUDA driver"),  # a machine without the NVIDIA driver
    (FakeDriver(devices=0), "auto", "no CUDA device 0"),
    (FakeDriver(devices=1), "cuda:1", "no CUDA device 1"),  # the loader names the error
    (FakeDriver(devices=1, retain_result=2), "cuda", "the primary context could not be "
                                                     "created"),
])
def test_no_gpu_changes_nothing(fresh, monkeypatch, driver, device, why):
    with_driver(monkeypatch, driver)
    result = device_prep.start_device_prep(device).join(timeout=10)
    assert result.skipped == why and result.context_seconds is None
    assert fresh == []  # no Triton work either: the start will not launch its kernels


@pytest.mark.parametrize("env", [("EDGE_LLM_KERNELS", "torch"), ("TRITON_INTERPRET", "1")])
def test_no_triton_hash_where_no_kernel_is_compiled(fresh, monkeypatch, env):
    monkeypatch.setenv(*env)
    with_driver(monkeypatch, FakeDriver(devices=1))
    result = device_prep.start_device_prep("cuda").join(timeout=10)
    assert result.context_seconds is not None and fresh == []


def test_phases_name_the_context_and_the_kernel_warmup(fresh, monkeypatch, caplog):
    with_driver(monkeypatch, FakeDriver(devices=1))
    result = device_prep.start_device_prep("cuda").join(timeout=10)
    stats = {"num_cuda_graphs": 13, "cuda_graph_capture_seconds": 0.75,
             "cuda_graph_memory_bytes": 96 << 20,
             "startup": {"demo_build_seconds": 0.0, "weight_load_seconds": 2.0,
                         "weight_bytes": int(4e9), "kernel_warmup_seconds": 1.25,
                         "device": "cuda"}}
    engine = SimpleNamespace(stats=lambda: stats)
    phases = StartupPhases()
    with caplog.at_level("INFO", logger="edge_llm.server"):
        phases.record_device_prep(result)
        phases.record_engine(engine, construct_seconds=5.0)
        phases.record_device_prep(device_prep.PrepResult("cpu", skipped="not a CUDA device"))
    assert phases.seconds["kernel_warmup"] == 1.25
    assert phases.seconds["cuda_graphs"] == 0.75
    assert phases.seconds["kv_allocation"] == pytest.approx(5.0 - 2.0 - 1.25 - 0.75)
    assert "cuda_context" in phases.seconds
    assert caplog.text.count("startup phase cuda_context") == 1  # none for a CPU
    assert "on a thread beside the imports; Triton's key hashed in" in caplog.text
    assert "startup phase kernel_warmup: 1.25 s" in caplog.text


def test_a_cpu_build_of_torch_holds_no_context(fresh, monkeypatch):
    monkeypatch.setattr(device_prep, "torch_built_with_cuda", lambda: False)
    opened = with_driver(monkeypatch, FakeDriver(devices=1))
    result = device_prep.start_device_prep("auto").join(timeout=10)
    assert opened == [] and result.skipped == "torch is not built with CUDA"


@pytest.mark.parametrize(("line", "cuda"), [
    ("cuda: Optional[str] = '12.8'", True), ("cuda = '12.1'", True),
    ("cuda: Optional[str] = None", False), ("cuda = None", False), ("", False),
])
def test_the_torch_build_is_read_without_importing_it(tmp_path, monkeypatch, line, cuda):
    import importlib.util

    (tmp_path / "__init__.py").write_text("raise ImportError('never imported')\n")
    (tmp_path / "version.py").write_text(f"__version__ = '2.10.0'\ndebug = False\n{line}\n"
                                         "hip: Optional[str] = None\n")
    spec = SimpleNamespace(origin=str(tmp_path / "__init__.py"))
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: spec if name == "torch" else None)
    assert device_prep.torch_built_with_cuda() is cuda
