"""Shared server fixtures: one real ``edge-llm serve`` process on the demo model per session."""

from __future__ import annotations

import os

# before anything imports torch (see edge_llm/__init__.py): no spinning OpenMP waiters
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import contextlib  # noqa: E402, I001
import random  # noqa: E402
import socket  # noqa: E402
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

SERVER_START_TIMEOUT = float(os.environ.get("EDGE_LLM_TEST_SERVER_TIMEOUT", "1200"))


@dataclass
class LiveServer:
    url: str
    process: subprocess.Popen | None  # None: a server started outside the tests
    log: Path | None

    def log_tail(self, lines: int = 40) -> str:
        if self.log is None:
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(server: LiveServer, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process is not None and server.process.poll() is not None:
            pytest.fail(f"edge-llm serve exited with {server.process.returncode}:\n"
                        f"{server.log_tail()}")
        try:
            if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"edge-llm serve not healthy after {timeout:.0f} s:\n{server.log_tail()}")


@pytest.fixture(scope="session")
def live_server(tmp_path_factory) -> LiveServer:
    """``python -m edge_llm.cli serve`` on the demo model (prepared on first use), small
    context, room for 40 concurrent sequences; killed at the end of the session.

    ``EDGE_LLM_TEST_SERVER_URL`` points the tests at a server started by hand instead (same
    flags and served model name expected)."""
    external = os.environ.get("EDGE_LLM_TEST_SERVER_URL")
    if external:
        server = LiveServer(external.rstrip("/"), None, None)
        wait_healthy(server, SERVER_START_TIMEOUT)
        yield server
        return
    log = tmp_path_factory.mktemp("server") / "serve.log"
    with serve_process(["--max-model-len", "1024", "--max-num-seqs", "40", "--max-queue", "64",
                        "--seed", "0"], log) as server:
        yield server


@contextlib.contextmanager
def serve_process(args: list[str], log: Path, timeout: float = SERVER_START_TIMEOUT,
                  env: dict[str, str] | None = None):
    """``python -m edge_llm.cli serve --port FREE ARGS`` on the demo model (the process's
    EDGE_LLM_* variables dropped, but the cache dir; ``env`` added), its output in ``log``;
    yields the LiveServer once /health is 200, and stops the process on exit (SIGTERM, then
    SIGKILL after 15 s) unless a test already did."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_LLM_")
               or k == "EDGE_LLM_CACHE_DIR"}
    environ.update(env or {})
    port = free_port()
    cmd = [sys.executable, "-m", "edge_llm.cli", "serve", "--port", str(port), *args]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=environ)
    server = LiveServer(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_healthy(server, timeout)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ---- fixtures of the HTTP-layer unit tests (fake engine in test_server_fake_engine.py) -----


@pytest.fixture(scope="session")
def fake_tokenizer():
    from tests.test_server_fake_engine import load_tokenizer

    return load_tokenizer()


@pytest.fixture
def token_scripts(fake_tokenizer, rng) -> list[list[int]]:
    """Two fresh random token scripts (real words, so the texts are readable)."""
    words = ["alpha", "beta", "gamma", "delta", "Paris", "river", "blue", "seven", "quiet"]
    texts = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(2)]
    return [fake_tokenizer.encode(t) for t in texts]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ---- seeds: every random draw of a test can be replayed -----------------------------------
# Hypothesis: the "ci" profile (the default) is derandomized (the same examples every run) and
# bounded; `--hypothesis-profile=long` draws fresh, many more examples (a failure prints a
# @reproduce_failure blob and is saved in .hypothesis/; docs/testing.md).
settings.register_profile("ci", max_examples=60, derandomize=True, database=None,
                          deadline=None, print_blob=True)
settings.register_profile("long", max_examples=2000, deadline=None, print_blob=True)
settings.load_profile("ci")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--rng-seed", type=int, default=None, metavar="N",
                     help="seed of the `rng` fixture (default: a fresh one per test, printed "
                          "in the output of a failing test)")


def _replayable_rng(request: pytest.FixtureRequest) -> random.Random:
    seed = request.config.getoption("--rng-seed")
    if seed is None:
        seed = random.randrange(2**32)
    print(f"random seed {seed} (replay: pytest --rng-seed={seed} {request.node.nodeid})")
    return random.Random(seed)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    """A random.Random with a fresh seed (or ``--rng-seed``), printed: a failing test shows it
    under "Captured stdout setup", and ``pytest --rng-seed=N <test id>`` replays the test."""
    return _replayable_rng(request)


@pytest.fixture(scope="module")
def module_rng(request: pytest.FixtureRequest) -> random.Random:
    """``rng`` for module-scoped fixtures (the seed shows with the module's first test)."""
    return _replayable_rng(request)

