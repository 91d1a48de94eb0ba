"""Starting ``edge-llm serve`` from a benchmark: a fresh process on a free port, timed to the
port opening, to ready (/health 200) and to the first streamed token, with the server's own
start-up phases (``edge_llm:startup_phase_seconds`` from /metrics); a level-1 sleep and
wake-up of a running server; and ``edge-llm warmup``, the same start-up up to ready that fills
the compile caches (an image's build step) and exits."""

from __future__ import annotations

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
from typing import Any

import httpx

from edge_llm import envs

PHASE = re.compile(r'^edge_llm:startup_phase_seconds\{phase="(\w+)"\} ([0-9.eE+-]+)$', re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_start(model: str | None, extra: list[str], timeout: float,
              after: Callable[[str], dict] | None = None, keep_log: Path | None = None,
              env: dict[str, str] | None = None) -> dict:
    """Start a server, time it to ready and to the first token, stop it (SIGTERM).

    ``after(url)``, if given, runs once the first token and the metrics are in (e.g. a sleep
    and wake measurement); its dict is merged into the result. ``keep_log``: where the
    server's log goes once it has stopped (else it is deleted). ``env``: the server's
    environment (default: this process's)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "edge_llm.cli", "serve", "--port", str(port),
           "--no-log-requests", *extra] + ([model] if model else [])
    log = tempfile.NamedTemporaryFile("w+b", suffix=".log", delete=False)
    began = time.perf_counter()
    # not from the repository root, where ./edge_llm would shadow the installed package
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            cwd=tempfile.gettempdir(), env=env)
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


def sleep_and_wake(url: str) -> dict[str, Any]:
    """POST /sleep?level=1, /health while asleep, POST /wake_up, then a first token again."""
    deadline = time.perf_counter() + 30
    while True:  # 409 while the first-token request (closed early) is still being aborted
        began = time.perf_counter()
        r = httpx.post(url + "/sleep", params={"level": 1}, timeout=600)
        slept = time.perf_counter() - began
        if r.status_code != 409 or time.perf_counter() > deadline:
            r.raise_for_status()
            break
        time.sleep(0.05)
    health = httpx.get(url + "/health", timeout=10).status_code
    began = time.perf_counter()
    httpx.post(url + "/wake_up", timeout=600).raise_for_status()
    woke = time.perf_counter() - began
    body = {"prompt": "The capital of France is", "max_tokens": 4, "stream": True}
    began = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                first = time.perf_counter() - began
                break
    return {"sleep_s": slept, "health_asleep": health, "wake_s": woke,
            "first_token_after_wake_s": first}


def cache_env(cache_dir: Path, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a start (or bake) from ``cache_dir``: this process's, then
    ``overrides``, then ``EDGE_LLM_CACHE_DIR`` = cache_dir with Triton's cache under it, and
    no TORCHINDUCTOR_CACHE_DIR (edge-llm then puts TorchInductor's cache under cache_dir too)."""
    return envs.child_environ({envs.CACHE_DIR: str(cache_dir),
                               envs.TRITON_CACHE_DIR: str(cache_dir / "triton"),
                               envs.TORCHINDUCTOR_CACHE_DIR: None}, overrides)


def bake(model: str, extra: list[str], cache_dir: Path, timeout: float) -> dict[str, Any]:
    """The image build step of recipes/warm-cache: ``edge-llm warmup MODEL EXTRA`` (the
    starts' serve flags) fills ``cache_dir`` (``EDGE_LLM_CACHE_DIR``, Triton's cache under
    it), so that the starts from it find every kernel and probe result there. ``summary``:
    warmup's last line (what the folder holds)."""
    env = cache_env(cache_dir)
    cmd = [sys.executable, "-m", "edge_llm.cli", "warmup", model, *extra]
    began = time.perf_counter()
    # from outside the checkout, as the starts run (the installed package is imported)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                         cwd=tempfile.gettempdir())
    done = [ln for ln in res.stderr.splitlines() if "Warm-up only: done." in ln]
    return {"seconds": time.perf_counter() - began, "exit_code": res.returncode,
            "summary": done[-1].split("done. ", 1)[-1] if done else "",
            "log_tail": res.stderr[-3000:]}
