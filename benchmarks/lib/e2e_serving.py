"""Serving scenario of the end-to-end benchmark: ``edge-llm serve`` in a subprocess, streamed
completions at several concurrency levels, time to first token and inter-token latency.

At each level ``c``, ``c`` clients share ``max(c, serve_min_requests)`` requests (each client
sends its next request when the last one ends). A request is a fresh random token-id prompt,
greedy, ``ignore_eos``, streamed; TTFT runs from sending to the first chunk with text, the
inter-token latencies are the gaps between chunks with text (the usage chunk gives the count).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .e2e_common import Profile, PromptMaker, log, percentile


def litestar_missing() -> str | None:
    """Why the server cannot start here (None if it can)."""
    try:
        import litestar  # noqa: F401
        import msgspec  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return (f"serving skipped: {exc} (carry the wheels of litestar and its needs; "
                f"see benchmarks/README.md)")
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, deadline: float) -> bool:
    """Poll ``url``/health until 200 (True); False once ``proc`` has exited or the
    ``time.perf_counter()`` ``deadline`` has passed."""
    import httpx

    while proc.poll() is None and time.perf_counter() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False


class Server:
    """A served model in a subprocess; ``stop()`` sends SIGTERM (then kills)."""

    def __init__(self, model: Path, args: list[str], log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "edge_llm.cli", "serve", str(model), "--port",
               str(self.port), "--no-log-requests", *args]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.began = time.perf_counter()
        # cwd away from the repository root: there ./edge_llm (without quant/ and kernels/,
        # which the install maps in) would shadow the installed package
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=log_path.parent)

    def wait_ready(self, timeout: float) -> float:
        """Seconds from the process start to /health 200; RuntimeError with the log tail."""
        if not wait_healthy(self.url, self.proc, self.began + timeout):
            raise RuntimeError(f"server not ready:\n{self.log_tail()}")
        return time.perf_counter() - self.began

    def log_tail(self, chars: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._log.close()
        return code


async def stream_completion(client, url: str, prompt: list[int], tokens: int) -> dict[str, Any]:
    """One streamed completion: TTFT, chunk gaps, completion tokens (from usage)."""
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    stamps: list[float] = []
    usage = None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if any(c.get("text") for c in chunk.get("choices", [])):
                stamps.append(time.perf_counter())
    if not stamps or usage is None:
        raise RuntimeError("stream ended without text or usage")
    if usage["completion_tokens"] != tokens:
        raise RuntimeError(f"got {usage['completion_tokens']} tokens, asked for {tokens}")
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return {"ttft": stamps[0] - sent, "gaps": gaps,
            "chunks": len(stamps), "tokens": usage["completion_tokens"],
            "end": stamps[-1] - sent}


async def run_level(url: str, level: int, prompts: list[list[int]],
                    tokens: int) -> dict[str, Any]:
    import httpx

    queue = list(prompts)
    results: list[dict] = []

    async def client_loop(client) -> None:
        while queue:
            results.append(await stream_completion(client, url, queue.pop(), tokens))

    limits = httpx.Limits(max_connections=level + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(level)))
        seconds = time.perf_counter() - began
    ttft = [r["ttft"] * 1e3 for r in results]
    gaps = [g * 1e3 for r in results for g in r["gaps"]]
    out_tokens = sum(r["tokens"] for r in results)
    return {
        "concurrency": level, "requests": len(results), "seconds": seconds,
        "output_tok_s": out_tokens / seconds, "chunks": sum(r["chunks"] for r in results),
        "tokens": out_tokens,
        "ttft_ms": {"p50": percentile(ttft, 50), "p99": percentile(ttft, 99)},
        "itl_ms": {"p50": percentile(gaps, 50), "p99": percentile(gaps, 99)},
    }


def forward_steps(url: str) -> dict[str, float]:
    """The server's ``edge_llm:forward_steps_total`` by path (decode_graph, short_graph,
    eager); empty if /metrics does not have it."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=30).text
    steps = {}
    for line in text.splitlines():
        if line.startswith("edge_llm:forward_steps_total{") and 'path="' in line:
            steps[line.split('path="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return steps


def scenario_serving(model: Path, p: Profile, device: str, prompts: PromptMaker,
                     work_dir: Path, ready_timeout: float = 1200.0) -> dict[str, Any]:
    """Start the server, warm it with one request, then every concurrency level."""
    args = ["--device", device, "--max-model-len", str(p.max_model_len),
            "--kv-cache-dtype", p.kv_cache_dtype]
    if p.kv_cache_memory is not None:
        args += ["--kv-cache-memory", str(p.kv_cache_memory)]
    if not device.startswith("cuda"):
        args += ["--swap-space", "0.0625"]
    server = Server(model, args, work_dir / "serve.log")
    res: dict[str, Any] = {"levels": {}}
    try:
        res["ready_s"] = server.wait_ready(timeout=ready_timeout)
        log.info("server ready in %.1f s", res["ready_s"])
        asyncio.run(run_level(server.url, 1, prompts.batch(1, p.serve_prompt), p.serve_tokens))
        for level in p.serve_levels:
            n = max(level, p.serve_min_requests)
            before = forward_steps(server.url)
            r = asyncio.run(run_level(server.url, level, prompts.batch(n, p.serve_prompt),
                                      p.serve_tokens))
            after = forward_steps(server.url)
            # forwards of this level by path: how many steps still ran eagerly
            r["forward_steps"] = {k: after[k] - before.get(k, 0.0) for k in after}
            total = sum(r["forward_steps"].values())
            log.info("serving c=%d: %.0f tok/s, TTFT p50 %.1f ms, ITL p50 %.1f / p99 %.1f ms; "
                     "%d forwards, %.1f%% eager", level, r["output_tok_s"], r["ttft_ms"]["p50"],
                     r["itl_ms"]["p50"], r["itl_ms"]["p99"], total,
                     100 * r["forward_steps"].get("eager", 0.0) / max(total, 1))
            res["levels"][str(level)] = r
    except Exception:
        log.error("server log tail:\n%s", server.log_tail())
        raise
    finally:
        res["exit_code"] = server.stop()
        phases = [ln for ln in server.log_path.read_text(errors="replace").splitlines()
                  if "startup phase" in ln or "Loaded " in ln]
        res["startup_log"] = phases[-12:]
    return res
