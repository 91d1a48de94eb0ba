"""``edge-llm warmup``: start as ``edge-llm serve`` would, up to ready, keep the caches, exit.

It takes every serve flag (and ``EDGE_LLM_*`` variable), builds the same engine and runs the
same start-up: memory probes, kernel warm-up, CUDA graph capture, the warm-up requests. What
that compiles and measures stays under ``EDGE_LLM_CACHE_DIR``: Triton's kernels (``triton/``),
the probe results (``probes/``), Triton's key (``triton_key.json``), the demo model when it was
built. Run on a machine with the target GPU type (kernels and probes are specific to it; the
probes also to the settings and the model), it is the build step that bakes those caches into
an image (recipes/warm-cache), so that no container compiles or profiles at start. No port is
opened. Exit codes as for ``serve``: 0 ready, 1 the model failed to load, 2 bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import Any

from edge_llm import envs
from edge_llm.cli import RunError, add_serve_arguments, prepare_serve

logger = logging.getLogger("edge_llm.server")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "warmup", help="start as serve would, keep the compiled kernels and probes, exit",
        description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_serve_arguments(parser)
    parser.set_defaults(func=run_warmup)


def run_warmup(args: argparse.Namespace) -> int:
    engine_cfg, server_cfg, lifecycle = prepare_serve(args)
    from edge_llm.server import create_app

    failures: list[BaseException] = []
    try:
        app = create_app(engine_cfg, server_cfg, on_load_failure=failures.append,
                         lifecycle=lifecycle)
    except (ValueError, OSError) as exc:
        raise RunError(str(exc)) from None
    error = asyncio.run(_load(app.state.ctx.holder))
    if error is not None:  # worded as serve words it
        raise RunError(f"the model failed to load: {failures[0] if failures else error}")
    root = envs.CACHE_DIR.get()
    logger.info("Warm-up only: done. %s keeps %s; copy it into the image for this GPU type "
                "(recipes/warm-cache)", root, cache_summary(root, envs.TRITON_CACHE_DIR.get()))
    return 0


async def _load(holder: Any) -> str | None:
    """Load as the server's lifespan does, wait for the end (however long: nothing waits
    for an answer), stop. The load's error, or None once ready."""
    await holder.start_loading()
    try:
        while holder.state in ("loading", "warming"):
            await asyncio.sleep(0.05)
    finally:
        await holder.shutdown()
    return holder.error


def cache_summary(root: Path, triton_dir: Path | None) -> str:
    """What the caches hold, in words: Triton's files and bytes, the probe results."""
    triton_dir = triton_dir or root / "triton"
    kernels = [p for p in triton_dir.rglob("*") if p.is_file()] if triton_dir.is_dir() else []
    probes = sorted((root / "probes").glob("*.json")) if (root / "probes").is_dir() else []
    size = sum(p.stat().st_size for p in kernels) / 1e6
    where = "" if triton_dir == root / "triton" else f" in {triton_dir}"
    return (f"{len(kernels)} Triton cache files ({size:.1f} MB){where} and "
            f"{len(probes)} start-up probe results")
