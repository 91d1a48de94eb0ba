"""Perplexity of a model before and after 4-bit quantization, on both bundled evaluation texts
(``quality.py weights``).

Each configuration reloads the fp32 model, quantizes it with ``quantize_model`` (which leaves
the dequantized weights in place), and scores the first ``tokens`` tokens of
``edge_llm/data/eval.txt`` (the text the demo's settings were tuned on) and of
``edge_llm/data/heldout.txt`` (used by no tuning) through transformers. With ``save_dir`` the
AWQ checkpoint is also written and scored again through edge-llm's own loader and
``QuantLinear`` (CPU reference path).
"""

from __future__ import annotations

import argparse
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


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None,
                    help="an fp16/fp32 transformers checkpoint folder (required but with --smoke)")
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


def run(args: argparse.Namespace) -> list[dict]:
    """One row per configuration (printed as it comes); the fp32 row is the reference."""
    for config in args.configs:
        if config != "fp32":
            _parse(config)  # a bad name fails before the first (slow) configuration
    tok = AutoTokenizer.from_pretrained(args.model)
    try:
        ids = evaluation_token_ids(tok, args.tokens)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    base, rows = None, []
    for config in args.configs:
        row = _run(config, args, tok, ids)
        rows.append(row)
        base = row["ppl"] if config == "fp32" else base
        cells = []
        for text, ppl in row["ppl"].items():
            rel = f" {100 * (ppl / base[text] - 1):+.1f}%" if base else ""
            edge = row.get("ppl_edge_llm", {}).get(text)
            cells.append(f"{text} {ppl:8.3f}{rel}" + (f" (edge-llm {edge:.3f})" if edge else ""))
        print(f"{config:10s} {'  '.join(cells)}  quantize {row['seconds']:6.1f} s", flush=True)
    return rows
