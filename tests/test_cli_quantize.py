"""``edge-llm quantize``: a real small model in, a loadable AWQ/GPTQ checkpoint out."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from edge_llm.cli import main
from edge_llm.model.full_forward import full_logits
from edge_llm.model.loader import load_model
from tests.engine_fixtures import demo_dir, make_tiny_model  # noqa: F401
from tests.helpers import rel_err


@pytest.fixture(scope="module")
def src(demo_dir, tmp_path_factory):  # noqa: F811
    return make_tiny_model(demo_dir, tmp_path_factory.mktemp("qsrc"), layers=2, hidden=64)


@pytest.mark.parametrize("fmt,method,flags", [
    ("awq", "gptq", []),
    ("gptq", "rtn", []),
    ("awq", "gptq", ["--desc-act", "--mse", "--damp", "0.001"]),  # the demo's recipe
])
def test_quantize_writes_a_loadable_checkpoint(src, tmp_path, capsys, fmt, method, flags):
    out = tmp_path / f"{fmt}-{method}"
    rc = main(["quantize", str(src), "--format", fmt, "--method", method, "--group-size", "32",
               "--nsamples", "4", "--seqlen", "64", "--out", str(out), *flags])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "quantized" in printed
    assert "tokens of the bundled eval text" in printed
    assert "tokens of the bundled heldout text" in printed
    # the source is scored before quantization overwrites its weights
    printed_source = [float(a) for a in re.findall(r"source ([\d.]+), quantized", printed)]
    assert printed_source == pytest.approx(_source_ppl(src), rel=2e-6)
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qcfg["quant_method"] == fmt and qcfg["group_size"] == 32
    quant = load_model(str(out), device="cpu", progress=False)
    base = load_model(str(src), device="cpu", progress=False)
    ids = torch.randint(0, 49152, (24,))
    # 4-bit weights on a random model: close to the source, not equal
    err = rel_err(full_logits(quant.model, ids), full_logits(base.model, ids))
    assert 1e-4 < err < 0.3


def _source_ppl(src) -> list[float]:
    from transformers import AutoTokenizer

    from edge_llm.quant import evaluation_token_ids, perplexity

    lm = load_model(str(src), device="cpu", dtype="float32", progress=False).model
    ids = evaluation_token_ids(AutoTokenizer.from_pretrained(str(src)), 2048)
    return [perplexity(lambda x: full_logits(lm, x[0]), ids[k], 512) for k in ("eval", "heldout")]


def test_bad_flags_and_missing_source_are_one_line(tmp_path):
    cmd = [sys.executable, "-m", "edge_llm.cli", "quantize"]
    res = subprocess.run(cmd + [str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1
    res = subprocess.run(cmd + ["x", "--bits", "3", "--out", str(tmp_path / "o")],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "--bits" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
