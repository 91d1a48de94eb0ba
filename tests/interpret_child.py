"""Run a test module's ``case_*`` functions in a child process under ``TRITON_INTERPRET=1``.

The interpreter must be switched on before Triton is imported, so each interpreted test module
runs itself as a script (``run_interpreted``) and its ``__main__`` block calls ``run_cases``;
the parent's tests then read one JSON report: {"seed", "interpret", "results": {case: "ok" or
a traceback}}. ``list_cases`` lists a module's cases, ``check_case`` is each parent test's
assertion on the report; ``rel_err`` and ``tolerance`` are the cases' error measure and bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

FP32_TOL = 1e-4
FP16_TOL = 1e-2  # fp16 / bf16 outputs


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; a non-finite output fails."""
    import torch

    out, ref = out.double(), ref.double()
    assert bool(torch.isfinite(out).all()), "non-finite output"
    return float((out - ref).norm() / ref.norm())


def tolerance(dtype) -> float:
    import torch

    return FP32_TOL if dtype == torch.float32 else FP16_TOL


def list_cases(namespace: dict) -> list[str]:
    """The ``case_*`` functions of a module namespace (``globals()``), sorted."""
    return sorted(name for name in dict(namespace) if name.startswith("case_"))


def check_case(report: dict, case: str) -> None:
    """The child ran under the interpreter, and ``case`` passed there."""
    assert report["interpret"], "the child did not run under TRITON_INTERPRET=1"
    assert report["results"][case] == "ok", f"seed {report['seed']}:\n{report['results'][case]}"


def run_interpreted(script: str, out_dir: Path) -> dict:
    """Run ``script`` with TRITON_INTERPRET=1; its report as a dict."""
    out = out_dir / "report.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, script, str(out)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert out.exists(), f"interpreter child failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())


def run_cases(out_path: str, namespace: dict, cases: list[str]) -> None:
    """Call each ``namespace[case]()`` with a fresh random seed; write the report."""
    import torch

    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    import triton.knobs

    results = {}
    for name in cases:
        try:
            namespace[name]()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()[-4000:]
    with open(out_path, "w") as f:
        json.dump({"seed": seed, "interpret": bool(triton.knobs.runtime.interpret),
                   "results": results}, f)
