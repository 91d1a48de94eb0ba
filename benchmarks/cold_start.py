"""Cold start of ``edge-llm serve``: process start -> port open -> /health 200 -> first token.

    python benchmarks/cold_start.py                  # the demo model, two starts
    python benchmarks/cold_start.py MODEL --starts 3 --serve-arg=--no-warmup

Each start is a fresh process on a free port; the first start may populate the compile caches
under ``EDGE_LLM_CACHE_DIR`` (Triton, TorchInductor), the later ones reuse them. Per start it
prints the wall-clock seconds to the port opening, to ready, to the first streamed token, and
the server's own start-up phases (``edge_llm:startup_phase_seconds`` from /metrics).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

PHASE = re.compile(r'^edge_llm:startup_phase_seconds\{phase="(\w+)"\} ([0-9.eE+-]+)$', re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_start(model: str | None, extra: list[str], timeout: float,
              after: Callable[[str], dict] | None = None, keep_log: Path | None = None) -> dict:
    """Start a server, time it to ready and to the first token, stop it (SIGTERM).

    ``after(url)``, if given, runs once the first token and the metrics are in (e.g. a sleep
    and wake measurement); its dict is merged into the result. ``keep_log``: where the
    server's log goes once it has stopped (else it is deleted)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "edge_llm.cli", "serve", "--port", str(port),
           "--no-log-requests", *extra] + ([model] if model else [])
    log = tempfile.NamedTemporaryFile("w+b", suffix=".log", delete=False)
    began = time.perf_counter()
    # not from the repository root, where ./edge_llm would shadow the installed package
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            cwd=tempfile.gettempdir())
    result: dict = {}
    try:
        while "ready" not in result:
            if proc.poll() is not None or time.perf_counter() - began > timeout:
                log.seek(0)
                raise RuntimeError("server did not get ready:\n"
                                   + log.read().decode(errors="replace")[-3000:])
            try:
                status = httpx.get(url + "/health", timeout=5).status_code
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            now = time.perf_counter() - began
            result.setdefault("port_open", now)
            if status == 200:
                result["ready"] = now
            else:
                time.sleep(0.05)
        body = {"prompt": "The capital of France is", "max_tokens": 8, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=timeout) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                    result["first_token"] = time.perf_counter() - began
                    break
        metrics = httpx.get(url + "/metrics", timeout=10).text
        result["phases"] = {k: float(v) for k, v in PHASE.findall(metrics)}
        if after is not None:
            result.update(after(url))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            result["exit_code"] = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            result["exit_code"] = proc.wait()
        log.close()
        if keep_log is not None:
            shutil.move(log.name, keep_log)
        else:
            os.unlink(log.name)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default=None, help="default: the demo model")
    parser.add_argument("--starts", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="extra flag for serve (repeat), e.g. --serve-arg=--max-model-len=512")
    parser.add_argument("--json", action="store_true", help="one JSON line per start")
    args = parser.parse_args()
    for i in range(1, args.starts + 1):
        r = one_start(args.model, args.serve_arg, args.timeout)
        if args.json:
            print(json.dumps({"start": i, **r}), flush=True)
            continue
        phases = " ".join(f"{k}={v:.2f}" for k, v in r["phases"].items())
        print(f"start {i}: port {r['port_open']:.2f} s, ready {r['ready']:.2f} s, first token "
              f"{r.get('first_token', float('nan')):.2f} s, exit {r['exit_code']} | {phases}",
              flush=True)


if __name__ == "__main__":
    main()
