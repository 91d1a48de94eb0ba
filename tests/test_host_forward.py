"""benchmarks/host_forward.py (the eager forward's host cost without a GPU) runs and prints
its table. In a child process: it replaces Triton's driver and torch.matmul for good."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.backends.compiler")
SCRIPT = Path(__file__).parents[1] / "benchmarks" / "host_forward.py"


def test_host_forward_prints_its_table(tmp_path):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--layers", "1", "--tokens", "1,16", "--runs", "2",
         "--ckpt-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=900,
        env={**__import__("os").environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")})
    assert out.returncode == 0, out.stderr[-3000:]
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$",
                      out.stdout, re.M)
    assert [r[0] for r in rows] == ["1", "16"], out.stdout
    for _, per_forward, per_layer, scaled, first_only in rows:
        assert 0 < float(per_forward) == pytest.approx(float(per_layer), rel=0.02)
        assert float(scaled) == pytest.approx(32 * float(per_layer), rel=0.02)
        assert float(first_only) > 0  # a one-layer model: the same forward (timing noise)
