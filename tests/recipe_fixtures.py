"""Shared pieces of the recipe tests: the recipes' files loaded as modules, one in-process
server over the fake engine (SageMaker routes on), and the serve options an environment gives."""

from __future__ import annotations

import argparse
import importlib.util
import random
import re
import shlex
import sys
from pathlib import Path

import httpx
import pytest

from edge_llm.cli import SERVE_OPTIONS, build_lifecycle, resolve_options
from edge_llm.config import EngineConfig, SchedulerConfig, ServerConfig
from edge_llm.server import create_app
from edge_llm.server.hooks import LifecycleConfig
from edge_llm.server.terminal_chat import ThreadedServer
from tests.test_lifecycle import SleepyEngine

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
# docs/scaling.md's sizing of one replica (from BENCHMARKS.md's serving table): C requests at
# once (--max-num-seqs), scale out at T ongoing requests per replica, N replicas at most by default
REPLICA_CONCURRENCY, SCALE_TARGET, DEFAULT_MAX_REPLICAS = 32, 24, 4
WORDS = ["alpha", "river", "seven", "blue", "quiet", "lamp", "north", "Paris"]


def load(path: str):
    """A recipe's Python file as a module (its folder on sys.path, as when run there)."""
    file = RECIPES / path
    sys.path.insert(0, str(file.parent))
    try:
        spec = importlib.util.spec_from_file_location(file.stem + "_recipe", file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(file.parent))
    return module


@pytest.fixture(scope="module")
def served(fake_tokenizer):
    """(url, engine, scripts): the fake engine behind a real socket, SageMaker routes on."""
    rng = random.Random()
    scripts = [fake_tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(10)))
               for _ in range(2)]
    engine = SleepyEngine(fake_tokenizer, scripts)
    app = create_app(EngineConfig(scheduler=SchedulerConfig(max_num_seqs=8)),
                     ServerConfig(log_requests=False, enable_sleep_endpoints=True),
                     engine_factory=lambda: engine,
                     lifecycle=LifecycleConfig(sagemaker=True, warmup=False))
    server = ThreadedServer(app)
    server.start()
    for _ in range(200):
        if httpx.get(server.url + "/health").status_code == 200:
            break
    yield server.url, engine, scripts
    server.stop()


def resolved(environ: dict[str, str]) -> argparse.Namespace:
    """The serve options the container's environment gives (as ``edge-llm serve`` sees it)."""
    args = argparse.Namespace(**{o.dest: None for o in SERVE_OPTIONS})
    args.port_given = any(environ.get(k) for k in ("EDGE_LLM_PORT", "PORT"))
    resolve_options(args, SERVE_OPTIONS, environ)
    args.lifecycle = build_lifecycle(args, environ)
    return args


def image_env() -> dict[str, str]:
    """The ENV the repository's Dockerfile sets (build arguments at their defaults)."""
    from tests.test_dockerfile import image_env as dockerfile_env

    env, _ = dockerfile_env()
    return {k: v for k, v in env.items() if k != "PATH"}


def readme_commands(recipe: str, program: str) -> list[list[str]]:
    """The shell commands of a recipe README's bash blocks that run ``program``, as argv lists
    (continuation lines joined, comments dropped)."""
    text = (RECIPES / recipe / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                for part in re.split(r"\s&&\s", line):
                    argv = shlex.split(part, comments=True)
                    while argv and re.fullmatch(r"\w+=.*", argv[0]):  # VAR=value prefixes
                        argv = argv[1:]
                    if argv and argv[0] == program:
                        commands.append(argv)
    return commands
