"""Perplexity of a model before and after 4-bit quantization, on the bundled evaluation text.

Each configuration reloads the fp32 model, quantizes it with ``quantize_model`` (which leaves
the dequantized weights in place), and scores the first ``--tokens`` tokens of
``edge_llm/data/eval.txt`` through transformers. Example::

    python benchmarks/perplexity.py --model /tmp/smol/hf --configs fp32 rtn-g32 gptq-g32
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from edge_llm.quant import load_eval_text, perplexity, quantize_model


def _parse(config: str) -> tuple[str, int]:
    method, _, group = config.partition("-g")
    if method not in ("rtn", "gptq", "awq") or not group.isdigit():
        raise ValueError(f"config must look like rtn-g32 / gptq-g64 / awq-g128 / fp32: {config!r}")
    return method, int(group)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="/tmp/smol/hf")
    ap.add_argument("--configs", nargs="+", default=["fp32", "rtn-g32", "rtn-g64", "gptq-g32",
                                                      "gptq-g64"])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--nsamples", type=int, default=64)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--damp", type=float, default=0.01)
    ap.add_argument("--no-true-sequential", action="store_true")
    ap.add_argument("--mse", action="store_true", help="search each group's clipping range")
    ap.add_argument("--act-order", action="store_true",
                    help="GPTQ columns in act-order with static (sequential) groups")
    ap.add_argument("--json", default=None, help="append one JSON line per configuration")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "transformers", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    tok = AutoTokenizer.from_pretrained(args.model)
    ids = torch.tensor(tok(load_eval_text())["input_ids"][: args.tokens])
    if ids.numel() < args.tokens:
        raise SystemExit(f"eval text has only {ids.numel()} tokens")
    base = None
    for config in args.configs:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
        seconds = 0.0
        if config != "fp32":
            method, group = _parse(config)
            start = time.perf_counter()
            quantize_model(model, tok, fmt="awq", method=method, group_size=group,
                           nsamples=args.nsamples, seqlen=args.seqlen, damp=args.damp,
                           true_sequential=not args.no_true_sequential, mse=args.mse,
                           desc_act=args.act_order, static_groups=args.act_order)
            seconds = time.perf_counter() - start
        ppl = perplexity(lambda x, m=model: m(input_ids=x, use_cache=False).logits, ids,
                         args.window)
        base = ppl if config == "fp32" else base
        rel = f"{100 * (ppl / base - 1):+.1f}%" if base else ""
        print(f"{config:10s} ppl {ppl:8.3f} {rel:>8s}  quantize {seconds:7.1f} s", flush=True)
        if args.json:
            row = dict(config=config, ppl=ppl, seconds=seconds, nsamples=args.nsamples,
                       seqlen=args.seqlen, damp=args.damp, tokens=args.tokens, mse=args.mse,
                       act_order=args.act_order, true_sequential=not args.no_true_sequential)
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
