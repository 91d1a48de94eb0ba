"""What Modal's lifecycle hooks do to the edge-llm server, with no Modal import (testable):

    @modal.enter(snap=True)   start the server, wait until ready (loaded + warmed up), then
                              POST /sleep?level=1: KV cache freed, weights in host memory;
                              Modal snapshots the container's memory after this returns
    @modal.enter(snap=False)  on every restore: POST /wake_up (weights back on the GPU) and
                              wait until /health says 200
"""

from __future__ import annotations

import time

import httpx


def wait_health(url: str, timeout: float) -> None:
    """Poll ``/health`` until 200; RuntimeError with the last answer after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url + "/health", timeout=5)
            if r.status_code == 200:
                return
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.25)
    raise RuntimeError(f"edge-llm at {url} not healthy after {timeout:.0f} s: {last}")


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def before_snapshot(url: str, *, api_key: str | None = None, timeout: float = 1800.0,
                    level: int = 1) -> dict:
    """Wait for readiness, then put the engine to sleep so the snapshot holds no GPU state."""
    wait_health(url, timeout)
    r = httpx.post(url + "/sleep", params={"level": level}, headers=_auth(api_key), timeout=120)
    r.raise_for_status()
    return r.json()


def after_restore(url: str, *, api_key: str | None = None, timeout: float = 600.0) -> dict:
    """Wake the engine (a no-op answer if it was awake) and wait until it serves."""
    r = httpx.post(url + "/wake_up", headers=_auth(api_key), timeout=timeout)
    r.raise_for_status()
    wait_health(url, timeout)
    return r.json()
