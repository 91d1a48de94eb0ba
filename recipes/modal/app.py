"""edge-llm on Modal with memory snapshots: ``modal deploy recipes/modal/app.py``.

The server runs in the container (uvicorn in a thread); the class's ``enter`` hooks put the
engine to sleep before the snapshot and wake it after each restore (see ``snapshot.py``), and
``web`` forwards Modal's web endpoint to it. Scale to zero is Modal's default
(``min_containers=0``); ``scaledown_window`` is how long an idle container lives.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import modal

sys.path.insert(0, str(Path(__file__).parent))
import snapshot  # noqa: E402 - beside this file, shipped with the image below

MODEL = os.environ.get("EDGE_LLM_MODEL", "")  # empty: the demo model
PORT = 8000
cache = modal.Volume.from_name("edge-llm-cache", create_if_missing=True)
image = (
    modal.Image.from_dockerfile(str(Path(__file__).parents[2] / "Dockerfile"),
                                context_dir=str(Path(__file__).parents[2]))
    .entrypoint([])
    .env({"EDGE_LLM_MODEL": MODEL, "EDGE_LLM_CACHE_DIR": "/cache"})
    .add_local_python_source("snapshot")
)
app = modal.App("edge-llm", image=image)


@app.cls(gpu="L4", volumes={"/cache": cache}, enable_memory_snapshot=True,
         experimental_options={"enable_gpu_snapshot": False}, scaledown_window=120,
         timeout=3600)
@modal.concurrent(max_inputs=64)
class EdgeLLM:
    @modal.enter(snap=True)
    def load(self) -> None:
        import subprocess

        self.proc = subprocess.Popen(["edge-llm", "serve", "--host", "127.0.0.1",
                                      "--port", str(PORT), "--enable-sleep-endpoints",
                                      "--allowed-hosts", "*"])  # Modal's proxy: *.modal.run
        snapshot.before_snapshot(f"http://127.0.0.1:{PORT}")

    @modal.enter(snap=False)
    def restore(self) -> None:
        snapshot.after_restore(f"http://127.0.0.1:{PORT}")

    @modal.web_server(PORT, startup_timeout=600)
    def web(self) -> None:
        """Modal proxies the OpenAI API (/v1/...) to the server started in ``load``."""
