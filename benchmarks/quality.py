"""What quality the lossy parts cost: 4-bit weights (perplexity before and after quantizing,
per method and group size) and the fp8 KV cache (perplexity ratio and greedy tokens against
the fp32 cache). CPU.

    python benchmarks/quality.py weights --model SRC --configs fp32 rtn-g32 gptq-g32 \\
        --act-order --mse --nsamples 64 --seqlen 128 --window 512   # the demo's recipe
    python benchmarks/quality.py kv-cache                # the demo model
    python benchmarks/quality.py weights --smoke         # a tiny random model, seconds
    python benchmarks/quality.py kv-cache --smoke

``weights``: SRC is an fp16/fp32 transformers checkpoint (e.g. SmolLM2-135M-Instruct);
configurations are ``fp32`` (the reference) and METHOD-gGROUP with METHOD rtn, gptq or awq.
``--smoke`` runs on a tiny random model with the demo's tokenizer (its perplexities mean
nothing; it checks that the path runs). Given ``--out DIR`` (or ``$OUT``) the rows are written
to ``quality_<part>.json`` there.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

from lib import kv_quality, weight_quality

from edge_llm import envs


def _smoke_model(root: Path) -> Path:
    """A tiny random fp16 checkpoint with the demo's (real) tokenizer."""
    from random_checkpoint import make_random_checkpoint

    from edge_llm.model.demo import ensure_demo_model

    return make_random_checkpoint("tiny-llama", "fp16", root / "tiny", device="cpu",
                                  tokenizer=ensure_demo_model())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="part", required=True)
    w = sub.add_parser("weights", help="perplexity before and after 4-bit quantization")
    weight_quality.add_arguments(w)
    kv = sub.add_parser("kv-cache", help="the fp8 KV cache against the fp32 one")
    kv.add_argument("--model", type=Path, default=None, help="default: the demo model")
    kv.add_argument("--tokens", type=int, default=2048)
    kv.add_argument("--window", type=int, default=512)
    kv.add_argument("--greedy", type=int, default=24, help="greedy tokens compared")
    for p in (w, kv):
        p.add_argument("--smoke", action="store_true", help="a tiny random model, few tokens")
        p.add_argument("--out", type=Path, default=envs.OUT.get())
    args = ap.parse_args(argv)
    if args.part == "weights" and args.model is None and not args.smoke:
        ap.error("weights: --model SRC is required (an fp16/fp32 transformers checkpoint)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "transformers", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="quality-") as tmp:
        if args.smoke:
            args.model = _smoke_model(Path(tmp))
            args.tokens, args.window = 128, 64
        if args.part == "weights":
            if args.smoke:
                args.configs, args.save_dir = ["fp32", "rtn-g32"], tmp
            result: object = weight_quality.run(args)
        else:
            result = kv_quality.run(args.model, args.tokens, args.window,
                                    4 if args.smoke else args.greedy)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"quality_{args.part.replace('-', '_')}.json"
        path.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
