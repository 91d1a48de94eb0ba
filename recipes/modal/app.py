"""edge-llm on Modal with memory snapshots: ``modal deploy recipes/modal/app.py``.

Modal snapshots a container's memory after its ``@modal.enter(snap=True)`` hooks and starts
later containers from that snapshot. GPU snapshots are off, so the snapshot phase runs without
a GPU: ``load`` only imports torch, Triton, transformers and the server (seconds of every cold
start) and touches no CUDA. After each restore, ``start`` builds the server from the
``EDGE_LLM_*`` environment, binds 0.0.0.0 (Modal's proxy reaches the container's interface,
not its loopback), lets it load the model onto the GPU and warm up, then commits the cache
volume: Triton's kernels, TorchInductor's cache, the start-up probes and the Hub download live
on the ``edge-llm-cache`` volume at /cache, so a cold start after the first compiles nothing.
``web`` is Modal's web endpoint for that port. Scale to zero is Modal's default
(``min_containers=0``); ``scaledown_window`` is how long an idle container lives.

Scaling (docs/scaling.md's sizing from BENCHMARKS.md's serving table): a container takes
``MAX_NUM_SEQS`` requests at once, the server's ``--max-num-seqs`` (``EDGE_LLM_MAX_NUM_SEQS`` at
deploy time, 32 by default), and Modal adds containers, up to ``MAX_CONTAINERS``, to keep
``TARGET_INPUTS`` (0.75 of it) on each, so a new one is up before the others are full.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import modal

PORT = 8000
CACHE_DIR = "/cache"
STARTUP_TIMEOUT_S = 1200  # a first start: download + load + kernel compiles + warm-up
REPO = Path(__file__).resolve().parents[2]
MAX_CONTAINERS = 4  # N: raise it (or update_autoscaler on the deployed class) for more GPUs


# `modal deploy` runs this file where only modal is installed: what it reads at import time
# (EDGE_LLM_MAX_NUM_SEQS, EDGE_LLM_MODEL) it reads from the environment itself; inside the
# container edge_llm's registry and flags read them (serve_args)
def _max_num_seqs(environ: dict[str, str]) -> int:
    raw = environ.get("EDGE_LLM_MAX_NUM_SEQS") or "32"
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"EDGE_LLM_MAX_NUM_SEQS must be a positive integer, got {raw!r}")
    return int(raw)


# read when `modal deploy` imports this file, baked into the image, read again in the container
MAX_NUM_SEQS = _max_num_seqs(dict(os.environ))
TARGET_INPUTS = max(1, MAX_NUM_SEQS * 3 // 4)

cache = modal.Volume.from_name("edge-llm-cache", create_if_missing=True)
image = (
    # root: Modal installs its client into the image's Python (the venv belongs to root) and
    # mounts the volume root-owned
    modal.Image.from_dockerfile(str(REPO / "Dockerfile"), context_dir=str(REPO),
                                build_args={"RUN_AS": "root"})
    .entrypoint([])
    .env({"EDGE_LLM_MODEL": os.environ.get("EDGE_LLM_MODEL", ""),  # empty: the demo model
          "EDGE_LLM_CACHE_DIR": CACHE_DIR,
          "EDGE_LLM_MAX_NUM_SEQS": str(MAX_NUM_SEQS)})
)
app = modal.App("edge-llm", image=image)


def serve_args(environ: dict[str, str] | None = None) -> argparse.Namespace:
    """``edge-llm serve``'s options from the environment, bound where Modal's proxy looks."""
    from edge_llm import envs
    from edge_llm.cli import SERVE_OPTIONS, resolve_options

    environ = dict(os.environ if environ is None else environ)
    args = argparse.Namespace(**{o.dest: None for o in SERVE_OPTIONS})
    args.host, args.port, args.port_given = "0.0.0.0", PORT, True
    if environ.get("EDGE_LLM_MAX_NUM_SEQS") and _max_num_seqs(environ) != MAX_NUM_SEQS:
        raise ValueError(f"EDGE_LLM_MAX_NUM_SEQS={environ['EDGE_LLM_MAX_NUM_SEQS']} but Modal was "
                         f"deployed to send {MAX_NUM_SEQS} at once: set it for `modal deploy`")
    args.max_num_seqs = MAX_NUM_SEQS  # what @modal.concurrent lets Modal send one container
    args.model = envs.MODEL.get(environ)
    resolve_options(args, SERVE_OPTIONS, environ)
    return args


def import_server() -> None:
    """What the snapshot keeps: the imports of a start, none of which initialises CUDA."""
    from edge_llm.server.hooks import set_compile_cache_env

    set_compile_cache_env()  # Triton/Inductor caches on the volume, before torch loads
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import edge_llm.engine.async_engine  # noqa: F401
    import edge_llm.server  # noqa: F401


def start_server(timeout: float = STARTUP_TIMEOUT_S) -> Any:
    """Build and start the server in this process (GPU work starts here); wait until ready."""
    import io

    from edge_llm.cli import build_configs, build_lifecycle
    from edge_llm.server import create_app
    from edge_llm.server.terminal_chat import ThreadedServer, wait_ready

    args = serve_args()
    engine_cfg, server_cfg = build_configs(args)
    app_ = create_app(engine_cfg, server_cfg, lifecycle=build_lifecycle(args))
    server = ThreadedServer(app_, host=args.host, port=args.port)
    server.start()
    error = wait_ready(f"http://127.0.0.1:{args.port}", timeout, io.StringIO())
    if error:
        raise RuntimeError(f"edge-llm did not become ready: {error}")
    return server


@app.cls(gpu="L4", volumes={CACHE_DIR: cache}, enable_memory_snapshot=True,
         scaledown_window=120, timeout=3600, min_containers=0, max_containers=MAX_CONTAINERS)
@modal.concurrent(max_inputs=MAX_NUM_SEQS, target_inputs=TARGET_INPUTS)
class EdgeLLM:
    @modal.enter(snap=True)
    def load(self) -> None:
        import_server()

    @modal.enter(snap=False)
    def start(self) -> None:
        self.server = start_server()
        cache.commit()  # kernels compiled by this start persist for the next cold start

    @modal.web_server(PORT, startup_timeout=STARTUP_TIMEOUT_S)
    def web(self) -> None:
        """Modal proxies the OpenAI API (/v1/...) to the server started in ``start``."""
