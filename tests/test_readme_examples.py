"""Every shell and Python example in README.md, run as a user of a fresh clone runs them.

The README's own serve command (``edge-llm serve`` on the demo model) is started once, checked
(``/health``, one request, a clean SIGTERM exit) and every other example runs against it. What
a test cannot run as written is adapted in the narrowest way: ``edge-llm`` becomes
``python -m edge_llm.cli`` (this checkout's code), port 8000 becomes a free port, and the
install before ``&&`` is left to the test set-up. Blocks preceded by ``<!-- gpu-only -->`` are
skipped, and so are those preceded by ``<!-- not-in-ci: REASON -->`` (a long-running program
CI cannot start), with the reason shown; the test command block must be exactly what
``.ci/run`` runs (CI runs it)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import SERVER_START_TIMEOUT, LiveServer, free_port, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GPU_ONLY = "<!-- gpu-only -->"
NOT_IN_CI = re.compile(r"<!-- not-in-ci: (.+) -->")
SHELL = ("bash", "sh", "shell", "console")
EXAMPLE_SECONDS = 120  # "finishes in seconds": generous for a loaded 2-core CI machine


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    gpu_only: bool
    not_in_ci: str | None = None  # why CI does not run it

    @property
    def name(self) -> str:
        return f"README.md:{self.line} ({self.lang})"


def readme_blocks() -> list[Block]:
    lines = README.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = re.fullmatch(r"```(\w*)\s*", lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        reason = NOT_IN_CI.fullmatch(before.strip())
        blocks.append(Block(m.group(1), "\n".join(lines[i + 1:end]) + "\n", i + 1,
                            before.strip() == GPU_ONLY, reason.group(1) if reason else None))
        i = end + 1
    return blocks


def is_test_command(block: Block) -> bool:
    return "pytest" in block.code


def serve_command(block: Block) -> str | None:
    """The ``edge-llm serve ...`` part of a block (after any ``install &&``), if it has one."""
    for line in block.code.splitlines():
        if "edge-llm serve" in line:
            return line[line.index("edge-llm serve"):].split("#")[0].strip()
    return None


BLOCKS = readme_blocks()
RUNNABLE = [b for b in BLOCKS if b.lang in (*SHELL, "python") and not b.gpu_only]
SERVE = sorted({c for b in RUNNABLE if not b.not_in_ci and (c := serve_command(b))})
CLIENT = [b for b in RUNNABLE if not serve_command(b) and not is_test_command(b)]


def test_readme_has_the_examples_this_file_expects():
    assert "edge-llm serve" in SERVE, SERVE  # the set-up and "Use it" start the demo
    assert any(b.gpu_only for b in BLOCKS)
    assert len(CLIENT) >= 3, [b.name for b in CLIENT]
    assert all(b.lang in (*SHELL, "python", "text") for b in BLOCKS), [b.lang for b in BLOCKS]


def test_test_command_is_what_ci_runs():
    (block,) = [b for b in RUNNABLE if is_test_command(b)]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert block.code.strip() == ci[-1].strip()


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if (not k.startswith("EDGE_LLM_") or k == "EDGE_LLM_CACHE_DIR") and k != "PORT"}


def start_server(command: str, log: Path) -> LiveServer:
    """A README serve command on a free port (8000, its default, may be taken here)."""
    port = free_port()
    cmd = command.replace("edge-llm", f"{sys.executable} -m edge_llm.cli", 1)
    argv = [*cmd.split(), "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=child_env(),
                                cwd=ROOT)
    server = LiveServer(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_healthy(server, SERVER_START_TIMEOUT)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return server


def answers_and_stops(server: LiveServer) -> None:
    """/health, one chat reply, then SIGTERM and a clean exit."""
    assert httpx.get(server.url + "/health").status_code == 200
    r = httpx.post(server.url + "/v1/chat/completions", timeout=EXAMPLE_SECONDS, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
    log = server.log.read_text(errors="replace")
    assert "NOT READY yet" in log and "READY: model " in log
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=60) == 0


@pytest.fixture(scope="module")
def readme_server(tmp_path_factory):
    """The README's plain ``edge-llm serve`` (the demo model): the clients' server."""
    server = start_server("edge-llm serve", tmp_path_factory.mktemp("readme") / "serve.log")
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


def adapt(code: str, server: LiveServer) -> str:
    port = server.url.rsplit(":", 1)[1]
    return code.replace("localhost:8000", f"localhost:{port}").replace(
        "edge-llm ", f"{sys.executable} -m edge_llm.cli ")


@pytest.mark.parametrize("block", [
    pytest.param(b, id=b.name, marks=[pytest.mark.skip(reason=b.not_in_ci)] if b.not_in_ci
                 else []) for b in CLIENT])
def test_example_runs_against_the_demo(block, readme_server):
    code = adapt(block.code, readme_server)
    argv = ["bash", "-euo", "pipefail", "-c", code] if block.lang in SHELL else \
        [sys.executable, "-c", code]
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=child_env(), cwd=ROOT,
                          timeout=EXAMPLE_SECONDS * 2)
    seconds = time.monotonic() - began
    assert done.returncode == 0, f"{block.name} failed:\n{done.stdout}\n{done.stderr}"
    out = done.stdout.strip()
    assert out, f"{block.name} printed nothing"
    try:
        body = json.loads(out)
    except ValueError:
        body = None
    assert not (isinstance(body, dict) and "error" in body), f"{block.name}: {out}"
    assert seconds < EXAMPLE_SECONDS, f"{block.name} took {seconds:.0f} s"


@pytest.mark.parametrize("command", [c for c in SERVE if c != "edge-llm serve"])
def test_other_serve_commands_start(command, tmp_path):
    server = start_server(command, tmp_path / "serve.log")
    try:
        answers_and_stops(server)
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


def test_readme_serve_command_answers_and_stops_cleanly(readme_server):
    """Runs last in this file (pytest keeps definition order): it stops the server."""
    answers_and_stops(readme_server)
    assert "READY: model SmolLM2-135M-Instruct-AWQ" in readme_server.log.read_text()
