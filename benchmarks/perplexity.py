"""Perplexity of a model before and after 4-bit quantization, on both bundled evaluation texts.

Each configuration reloads the fp32 model, quantizes it with ``quantize_model`` (which leaves
the dequantized weights in place), and scores the first ``--tokens`` tokens of
``edge_llm/data/eval.txt`` (the text the demo's settings were tuned on) and of
``edge_llm/data/heldout.txt`` (used by no tuning) through transformers. With ``--save-dir`` the
AWQ checkpoint is also written and scored again through edge-llm's own loader and
``QuantLinear`` (CPU reference path). Example (the demo's recipe, 512-token windows)::

    python benchmarks/perplexity.py --model /tmp/smol/hf --configs fp32 rtn-g32 gptq-g32 \
        --act-order --mse --nsamples 64 --seqlen 128 --window 512

SmolLM2-135M-Instruct (fp32 safetensors), 2,048 eval tokens in one window, 2-core CPU
(eval text only; quantize seconds on a quiet machine; fp32 ppl 28.016)::

    RTN g32 / g64                                             +26.0% / +34.7%    3 s
    GPTQ g32 / g64, 32 x 256 calibration, damp 0.01           +17.1% / +25.3%   56 s
    GPTQ g32 / g64, --act-order (static groups, AWQ-storable),
        64 x 128 calibration, --damp 0.001                     +6.3% / +10.0%   55 s
    the same g64 checkpoint re-scored through edge-llm's loader: ppl 30.816 (30.817)

The example command above, both texts, 512-token windows (fp32 ppl 31.518 / 35.403)::

    config      eval     heldout   quantize
    rtn-g32    +24.3%    +20.6%      42 s   (--mse applies to RTN too: range search)
    rtn-g64    +31.3%    +28.9%      42 s
    gptq-g32    +4.3%     +6.2%     108 s   (the demo's recipe)
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from edge_llm.quant import (
    evaluation_token_ids,
    perplexity,
    quantization_config_for,
    quantize_model,
    save_quantized,
)


def _parse(config: str) -> tuple[str, int]:
    method, _, group = config.partition("-g")
    if method not in ("rtn", "gptq", "awq") or not group.isdigit():
        raise ValueError(f"config must look like rtn-g32 / gptq-g64 / awq-g128 / fp32: {config!r}")
    return method, int(group)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="/tmp/smol/hf")
    ap.add_argument("--configs", nargs="+",
                    default=["fp32", "rtn-g32", "rtn-g64", "gptq-g32", "gptq-g64"])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--nsamples", type=int, default=32)
    ap.add_argument("--seqlen", type=int, default=256)
    ap.add_argument("--damp", type=float, default=0.01)
    ap.add_argument("--no-true-sequential", action="store_true")
    ap.add_argument("--mse", action="store_true", help="search each group's clipping range")
    ap.add_argument("--act-order", action="store_true",
                    help="GPTQ columns in act-order with static (sequential) groups")
    ap.add_argument("--dynamic-groups", action="store_true",
                    help="with --act-order: groups in processing order (GPTQ format, g_idx)")
    ap.add_argument("--save-dir", default=None, help="write each AWQ checkpoint here and "
                    "score it again through edge-llm's loader")
    ap.add_argument("--json", default=None, help="append one JSON line per configuration")
    return ap.parse_args()


def _edge_llm_ppl(path: Path, ids: dict[str, torch.Tensor], window: int) -> dict[str, float]:
    from edge_llm.model.full_forward import full_logits
    from edge_llm.model.loader import load_model

    lm = load_model(str(path), device="cpu", dtype="float32", progress=False).model
    return {k: perplexity(lambda x: full_logits(lm, x[0]), t, window) for k, t in ids.items()}


def _run(config: str, args, tok, ids: dict[str, torch.Tensor]) -> dict:
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    row = dict(config=config, seconds=0.0, nsamples=args.nsamples, seqlen=args.seqlen,
               damp=args.damp, tokens=args.tokens, mse=args.mse, act_order=args.act_order,
               dynamic_groups=args.dynamic_groups, true_sequential=not args.no_true_sequential)
    state, fmt = None, "awq"
    if config != "fp32":
        method, group = _parse(config)
        act_order = args.act_order and method == "gptq"  # the other methods have no column order
        fmt = "gptq" if act_order and args.dynamic_groups else "awq"
        start = time.perf_counter()
        state = quantize_model(
            model, tok, fmt=fmt, method=method, group_size=group, nsamples=args.nsamples,
            seqlen=args.seqlen, damp=args.damp, true_sequential=not args.no_true_sequential,
            mse=args.mse, desc_act=act_order, static_groups=act_order and not args.dynamic_groups,
        )
        row["seconds"] = time.perf_counter() - start
    row["ppl"] = {k: perplexity(lambda x: model(input_ids=x, use_cache=False).logits, t,
                                args.window) for k, t in ids.items()}
    if state is not None and args.save_dir and fmt == "awq":
        out = save_quantized(Path(args.save_dir) / config, state, model.config.to_dict(),
                             quantization_config_for("awq", group_size=_parse(config)[1]),
                             tokenizer=tok)
        row["ppl_edge_llm"] = _edge_llm_ppl(out, ids, args.window)
    return row


def main() -> None:
    args = _args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "transformers", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    tok = AutoTokenizer.from_pretrained(args.model)
    try:
        ids = evaluation_token_ids(tok, args.tokens)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    base = None
    for config in args.configs:
        row = _run(config, args, tok, ids)
        base = row["ppl"] if config == "fp32" else base
        cells = []
        for text, ppl in row["ppl"].items():
            rel = f" {100 * (ppl / base[text] - 1):+.1f}%" if base else ""
            edge = row.get("ppl_edge_llm", {}).get(text)
            cells.append(f"{text} {ppl:8.3f}{rel}" + (f" (edge-llm {edge:.3f})" if edge else ""))
        print(f"{config:10s} {'  '.join(cells)}  quantize {row['seconds']:6.1f} s", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
