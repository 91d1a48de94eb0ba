"""``edge-llm quantize SRC --format awq|gptq --group-size N --out DIR``.

Loads an fp16/bf16/fp32 Hugging Face checkpoint (a local folder or a hub id) with transformers,
quantizes its decoder linears with round-to-nearest or a calibrated method on the bundled
calibration texts, writes the producers' checkpoint layout, and reports perplexity on both
bundled evaluation texts (the tuning one and the held-out one) before and after.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from edge_llm.cli import RunError, UsageError


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's help ends with its default, except a required one's (it has none)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or action.default is None:
            return action.help
        return super()._get_help_string(action)


def register(subparsers) -> None:
    p = subparsers.add_parser("quantize", help="quantize a model to 4-bit AWQ or GPTQ",
                              formatter_class=_HelpWithDefaults,
                              description="Quantize the decoder linears of an fp16/bf16/fp32 "
                              "checkpoint to 4 bits on bundled calibration text, write it in "
                              "the AWQ or GPTQ checkpoint layout and report perplexity before "
                              "and after.")
    p.add_argument("src", help="source model: local folder or hub id (fp16/bf16/fp32)")
    p.add_argument("--format", dest="fmt", choices=("awq", "gptq"), default="awq",
                   help="checkpoint layout written: AWQ GEMM or GPTQ")
    p.add_argument("--method", choices=("rtn", "gptq", "awq"), default="gptq",
                   help="rtn: round to nearest; gptq: GPTQ's Hessian method; awq: autoawq")
    p.add_argument("--bits", type=int, default=4, help="weight bits (4 is the only width "
                   "edge-llm serves)")
    p.add_argument("--group-size", type=int, default=128,
                   help="columns sharing one scale and zero point (-1: one group per row)")
    p.add_argument("--sym", action="store_true", help="symmetric zero points")
    p.add_argument("--desc-act", action="store_true",
                   help="GPTQ columns in act-order; with --format awq the groups stay "
                        "sequential (static groups), as AWQ GEMM stores them")
    p.add_argument("--mse", action="store_true",
                   help="search each group's clipping range (AutoGPTQ's MSE grid)")
    p.add_argument("--damp", type=float, default=0.01,
                   help="GPTQ damping, a fraction of the Hessian's mean diagonal")
    p.add_argument("--nsamples", type=int, default=128,
                   help="calibration windows taken from the bundled texts")
    p.add_argument("--seqlen", type=int, default=512, help="tokens per calibration window")
    p.add_argument("--out", required=True, help="output folder (must be empty or absent)")
    p.add_argument("--no-eval", action="store_true", help="skip the perplexity report")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.bits != 4:
        raise UsageError(f"--bits must be 4 (the only width edge-llm serves), got {args.bits}")
    if args.group_size != -1 and args.group_size < 1:
        raise UsageError(f"--group-size must be -1 or >= 1, got {args.group_size}")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise RunError(f"output folder is not empty: {out}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from edge_llm.model.weights import resolve_model_path
    from edge_llm.quant import (
        load_calibration_texts,
        quantization_config_for,
        quantize_model,
        save_quantized,
    )

    try:
        src = resolve_model_path(args.src)
    except FileNotFoundError as exc:
        raise RunError(str(exc)) from None
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(src))
    # quantize_model overwrites the weights with their dequantized values: score the source first
    source_ppl = None if args.no_eval else _source_perplexity(model, tok)
    start = time.perf_counter()
    static_groups = args.desc_act and args.fmt == "awq"
    try:
        state = quantize_model(
            model, tok, fmt=args.fmt, method=args.method, group_size=args.group_size,
            sym=args.sym, desc_act=args.desc_act, static_groups=static_groups, mse=args.mse,
            damp=args.damp, calib_texts=load_calibration_texts(), nsamples=args.nsamples,
            seqlen=args.seqlen,
        )
        qcfg = quantization_config_for(args.fmt, group_size=args.group_size, sym=args.sym,
                                       desc_act=args.desc_act and not static_groups,
                                       damp_percent=args.damp)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    seconds = time.perf_counter() - start
    cfg = json.loads((src / "config.json").read_text())
    cfg["torch_dtype"] = "float16"
    save_quantized(out, state, cfg, qcfg, tokenizer=tok)
    gen = src / "generation_config.json"
    if gen.is_file():
        (out / "generation_config.json").write_text(gen.read_text())
    print(f"quantized {args.src} -> {out} ({args.fmt}, {args.method}, group {args.group_size}) "
          f"in {seconds:.1f} s")
    if source_ppl is not None:
        _report_perplexity(out, tok, source_ppl)
    return 0


def _source_perplexity(model, tok) -> dict[str, float]:
    """Perplexity of the unquantized transformers model on 2,048 tokens of each bundled
    evaluation text, 512-token windows."""
    import torch

    from edge_llm.quant import evaluation_token_ids, perplexity

    with torch.no_grad():
        return {name: perplexity(lambda x: model(x).logits, ids, window=512)  # x: (1, T)
                for name, ids in evaluation_token_ids(tok, 2048).items()}


def _report_perplexity(out: Path, tok, source_ppl: dict[str, float]) -> None:
    """The written checkpoint (our loader) against the source, same tokens and windows."""
    from edge_llm.model.full_forward import full_logits
    from edge_llm.model.loader import load_model
    from edge_llm.quant import evaluation_token_ids, perplexity

    quant = load_model(str(out), device="cpu", progress=False)
    for name, ids in evaluation_token_ids(tok, 2048).items():
        base = source_ppl[name]
        qppl = perplexity(lambda x: full_logits(quant.model, x[0]), ids, window=512)
        print(f"perplexity on {ids.numel()} tokens of the bundled {name} text: source "
              f"{base:.3f}, quantized {qppl:.3f} ({(qppl / base - 1) * 100:+.1f}%)")
