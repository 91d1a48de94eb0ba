"""The page-cache prefetch ``edge-llm serve`` starts before importing torch
(edge_llm/model/prefetch.py): which files it finds, the memory-room guard, the flag, and that
the kernel is really asked (a file read back afterwards is unchanged). Whether it shortens a
cold start is measured on the GPU machine (benchmarks/cold_start.py, start 2)."""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest

from edge_llm.model import prefetch as pf

pytestmark = pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise")


def _checkpoint(folder, sizes=(3000, 5000), index=False):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    names = [f"model-{i:05d}-of-{len(sizes):05d}.safetensors" for i in range(len(sizes))]
    for name, size in zip(names, sizes, strict=True):
        (folder / name).write_bytes(os.urandom(size))
    if index:
        weight_map = {f"t{i}": names[i % len(names)] for i in range(5)}
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": weight_map}))
    (folder / "notes.bin").write_bytes(b"x" * 10)
    return folder, names


def test_checkpoint_files_of_a_folder(tmp_path):
    folder, names = _checkpoint(tmp_path / "plain")
    assert [f.name for f in pf.checkpoint_files(str(folder))] == names
    indexed, names = _checkpoint(tmp_path / "indexed", (100, 200, 300), index=True)
    (indexed / "stray.safetensors").write_bytes(b"y")  # not in the index: not read
    assert [f.name for f in pf.checkpoint_files(str(indexed))] == names
    (indexed / "model.safetensors.index.json").write_text("{not json")
    assert pf.checkpoint_files(str(indexed)) == []  # the loader reports it, not this


def test_nothing_for_models_not_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert pf.checkpoint_files("someone/not-downloaded") == []
    assert pf.checkpoint_files(str(tmp_path / "missing")) == []
    assert pf.checkpoint_files("./relative/missing") == []
    monkeypatch.setenv("EDGE_LLM_CACHE_DIR", str(tmp_path / "empty-cache"))
    assert pf.checkpoint_files(None) == []  # the demo model, not built yet


def test_demo_model_once_built(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_LLM_CACHE_DIR", str(tmp_path))
    from edge_llm.model.demo import demo_model_dir

    _, names = _checkpoint(demo_model_dir())
    assert [f.name for f in pf.checkpoint_files(None)] == names


def test_prefetch_reads_nothing_wrong_and_counts_bytes(tmp_path):
    folder, _ = _checkpoint(tmp_path / "m", (4096, 123457))
    files = pf.checkpoint_files(str(folder))
    before = [f.read_bytes() for f in files]
    assert pf.prefetch(files + [tmp_path / "gone.safetensors"]) == 4096 + 123457
    assert [f.read_bytes() for f in files] == before
    cache = tmp_path / "triton"
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "k.cubin").write_bytes(b"c" * 700)
    (cache / "k.json").write_bytes(b"j" * 30)
    assert [p.name for p in pf.cache_files(cache)] == ["k.json", "k.cubin"]
    assert pf.prefetch_model(str(folder), compile_cache=cache) == (4096 + 123457, 730)
    assert pf.cache_files(tmp_path / "no-cache") == []


def test_memory_room_guard(tmp_path, monkeypatch, caplog):
    folder, _ = _checkpoint(tmp_path / "m", (10_000, 10_000))
    room = pf.memory_room()
    assert room is None or room > 0
    monkeypatch.setattr(pf, "memory_room", lambda: 30_000)  # the files are 2/3 of it
    with caplog.at_level(logging.INFO, logger=pf.logger.name):
        assert pf.prefetch_model(str(folder)) == (0, -1)
    assert "not reading the checkpoint" in caplog.text
    monkeypatch.setattr(pf, "memory_room", lambda: 40_000)
    assert pf.prefetch_model(str(folder)) == (20_000, 0)


def test_start_prefetch_runs_on_a_thread_and_logs(tmp_path, caplog):
    folder, _ = _checkpoint(tmp_path / "m")
    with caplog.at_level(logging.INFO, logger=pf.logger.name):
        thread = pf.start_prefetch(str(folder), compile_cache=tmp_path / "none")
        assert thread is not None and thread.daemon
        thread.join(30)
        pf.start_prefetch(str(tmp_path / "missing")).join(30)
    assert "Prefetch: 0.00 GB of checkpoint" in caplog.text
    assert "Prefetch: nothing read" in caplog.text


def test_imports_no_torch():
    """It runs before torch is imported: importing it must not import torch."""
    import subprocess

    code = ("import sys, edge_llm.model.prefetch as p; p.checkpoint_files(None); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False", out.stderr
