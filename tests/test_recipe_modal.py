"""The Modal recipe with the ``modal`` package itself: the app imported as ``modal deploy``
imports it, and the class's function spec as Modal records it (GPU, cache volume, memory
snapshots without GPU snapshots, lifecycle hooks, web server port); the snapshot phase run with
CUDA booby-trapped (it must not touch the GPU: there is none then); the post-restore phase
run for real on the demo model (CPU here): it binds 0.0.0.0 on the web server's port, serves,
and commits the cache volume."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.recipe_fixtures import (
    DEFAULT_MAX_REPLICAS,
    RECIPES,
    REPLICA_CONCURRENCY,
    ROOT,
    SCALE_TARGET,
    readme_commands,
)

modal = pytest.importorskip("modal", reason="the modal package is in the test extra")
APP = RECIPES / "modal" / "app.py"


@pytest.fixture(scope="module")
def recipe():
    """(module, the kwargs Modal's app.cls gave its Function, {hook name: _PartialFunction})."""
    from modal import _functions
    from modal._partial_function import _find_partial_methods_for_user_cls, _PartialFunctionFlags

    seen: list[dict] = []
    original = _functions._Function._from_local

    def record(*args, **kw):
        seen.append(kw)
        return original(*args, **kw)

    _functions._Function._from_local = record
    try:
        with warnings.catch_warnings(), pytest.MonkeyPatch.context() as mp:
            mp.delenv("EDGE_LLM_MAX_NUM_SEQS", raising=False)  # the recipe's default
            warnings.simplefilter("ignore")
            spec = importlib.util.spec_from_file_location("modal_recipe_app", APP)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    finally:
        _functions._Function._from_local = original
    (kw,) = seen
    user_cls = module.EdgeLLM._get_user_cls()
    hooks = _find_partial_methods_for_user_cls(user_cls, _PartialFunctionFlags.all())
    return module, kw, hooks


def test_function_spec(recipe):
    from modal._partial_function import _PartialFunctionFlags as F

    module, kw, hooks = recipe
    assert kw["gpu"] == "L4"
    assert set(kw["volumes"]) == {module.CACHE_DIR}
    assert repr(kw["volumes"][module.CACHE_DIR]) == "modal.Volume.from_name('edge-llm-cache')"
    assert kw["enable_memory_snapshot"] is True
    # no GPU snapshots: the snapshot phase runs without a GPU
    assert kw["experimental_options"].get("enable_gpu_snapshot", "False") == "False"
    assert hooks["load"].flags & F.ENTER_PRE_SNAPSHOT
    assert hooks["start"].flags & F.ENTER_POST_SNAPSHOT
    web = hooks["web"].params.webhook_config
    assert web.web_server_port == module.PORT
    args = module.serve_args({})
    assert (args.host, args.port) == ("0.0.0.0", web.web_server_port)


def test_autoscaling_matches_the_server_concurrency(recipe):
    """Modal sends a container at most max_inputs requests: the server's --max-num-seqs; it adds
    containers (0 to N) to keep target_inputs, below that, on each."""
    module, kw, _ = recipe
    assert kw["max_concurrent_inputs"] == module.serve_args({}).max_num_seqs == REPLICA_CONCURRENCY
    assert kw["target_concurrent_inputs"] == SCALE_TARGET < kw["max_concurrent_inputs"]
    assert not kw["min_containers"] and kw["max_containers"] == DEFAULT_MAX_REPLICAS > 1
    # the container's environment cannot pull the server away from what Modal sends it
    assert module.serve_args({"EDGE_LLM_MAX_NUM_SEQS": "32"}).max_num_seqs == REPLICA_CONCURRENCY
    with pytest.raises(ValueError, match="modal deploy"):
        module.serve_args({"EDGE_LLM_MAX_NUM_SEQS": "64"})
    assert module._max_num_seqs({"EDGE_LLM_MAX_NUM_SEQS": "48"}) == 48
    with pytest.raises(ValueError, match="EDGE_LLM_MAX_NUM_SEQS"):
        module._max_num_seqs({"EDGE_LLM_MAX_NUM_SEQS": "0"})


SNAPSHOT_PROBE = r"""
import os, sys, warnings
warnings.simplefilter("ignore")
import torch
def trap(name):
    def f(*a, **k):  # from any thread: report and end the process at once
        print("CUDA touched in the snapshot phase: " + name, flush=True)
        os._exit(3)
    return f
for name in ("is_available", "device_count", "init", "_lazy_init", "current_device",
             "get_device_properties", "mem_get_info", "set_device", "synchronize"):
    setattr(torch.cuda, name, trap(name))
import importlib.util
spec = importlib.util.spec_from_file_location("app", sys.argv[1])
app = importlib.util.module_from_spec(spec)
spec.loader.exec_module(app)
from modal._partial_function import _find_partial_methods_for_user_cls, _PartialFunctionFlags as F
user_cls = app.EdgeLLM._get_user_cls()
(load,) = _find_partial_methods_for_user_cls(user_cls, F.ENTER_PRE_SNAPSHOT).values()
load.raw_f(user_cls())
for name in ("torch", "transformers", "edge_llm.server", "edge_llm.engine.async_engine"):
    assert name in sys.modules, name
print("snapshot phase ok")
"""


def test_snapshot_phase_imports_and_touches_no_cuda():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("EDGE_LLM_") or k == "EDGE_LLM_CACHE_DIR"}
    env |= {"PYTHONPATH": str(ROOT), "EDGE_LLM_MAX_MODEL_LEN": "256"}
    r = subprocess.run([sys.executable, "-c", SNAPSHOT_PROBE, str(APP)], env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "snapshot phase ok" in r.stdout, (r.stdout + r.stderr)[-3000:]


def listening_address(port: int) -> str:
    """The local address of the socket listening on ``port`` (from /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            return ".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return "none"


def test_after_restore_serves_on_all_interfaces_and_commits_the_cache(recipe, monkeypatch):
    module, _, hooks = recipe
    commits = []
    monkeypatch.setattr(module, "cache", type("Volume", (), {
        "commit": staticmethod(lambda: commits.append(time.monotonic()))})())
    monkeypatch.setattr(module, "PORT", free_port())
    for name in [k for k in os.environ if k.startswith("EDGE_LLM_") and k != "EDGE_LLM_CACHE_DIR"]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("EDGE_LLM_MAX_MODEL_LEN", "256")
    instance = module.EdgeLLM._get_user_cls()()
    hooks["start"].raw_f(instance)
    try:
        assert listening_address(module.PORT) == "0.0.0.0"
        assert httpx.get(f"http://127.0.0.1:{module.PORT}/health").status_code == 200
        assert len(commits) == 1
    finally:
        instance.server.stop()


def test_readme_deploy_command_names_the_app():
    (deploy,) = [c for c in readme_commands("modal", "modal") if c[1] == "deploy"]
    assert (ROOT / deploy[2]).resolve() == APP
