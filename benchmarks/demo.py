"""The demo model against its source and round-to-nearest: perplexity, greedy answer, CPU speed.

    python benchmarks/demo.py [--no-speed] [EXTRA_CHECKPOINT_DIR ...]

Prints one table: the dequantized GGUF source (fp32), round-to-nearest AWQ checkpoints of the
same source at group 32 and 64 (written to a temporary folder), the cached demo checkpoint
(the calibrated method the demo ships) and any extra checkpoint folders. Each quantized row runs
through edge-llm's loader and decoder. Perplexity ratios are against the source on 2,048 tokens
of each bundled evaluation text in 512-token windows: ``eval`` (edge_llm/data/eval.txt, which
the demo's settings were tuned on) and ``heldout`` (edge_llm/data/heldout.txt, used by no tuning).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from edge_llm import LLM, SamplingParams
from edge_llm.model.demo import (
    DEMO_GGUF,
    cache_dir,
    ensure_demo_model,
    hf_config_dict,
    load_gguf_model,
)
from edge_llm.model.full_forward import full_logits
from edge_llm.model.loader import load_model
from edge_llm.quant import (
    evaluation_token_ids,
    perplexity,
    quantization_config_for,
    quantize_model,
    save_quantized,
)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WINDOW = 512


def _speed(llm: LLM, batch: int) -> float:
    p = [{"prompt_token_ids": list(range(100, 140))}] * batch
    sp = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    llm.generate(p[:1], sp, use_tqdm=False)
    t = time.perf_counter()
    llm.generate(p, sp, use_tqdm=False)
    return batch * 32 / (time.perf_counter() - t)


def write_rtn(gguf: Path, group_size: int, out: Path) -> Path:
    """Round-to-nearest AWQ checkpoint of the demo source at ``group_size``."""
    model, tok = load_gguf_model(gguf)
    state = quantize_model(model, tok, fmt="awq", method="rtn", group_size=group_size)
    return save_quantized(out, state, hf_config_dict(model),
                          quantization_config_for("awq", group_size=group_size), tokenizer=tok)


def source_answer(model, tok) -> str:
    """Greedy answer of the transformers source model (24 new tokens at most)."""
    x = tok.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt",
                                return_dict=True)
    out = model.generate(**x, max_new_tokens=24, do_sample=False)  # (1, prompt + new)
    return tok.decode(out[0, x["input_ids"].shape[1]:], skip_special_tokens=True)


def _answer_cells(answer: str) -> dict:
    answer = answer.strip().replace("\n", " ")
    return {"paris": "yes" if "Paris" in answer else "NO", "answer": answer[:36]}


def score(path: Path, ids: dict[str, torch.Tensor], base: dict[str, float], speed: bool) -> dict:
    """Perplexity ratios, greedy answer and decode speed of one checkpoint folder."""
    lm = load_model(str(path), device="cpu", progress=False).model
    row = {name: perplexity(lambda x: full_logits(lm, x[0]), t, WINDOW) / base[name]
           for name, t in ids.items()}
    llm = LLM(str(path), device="cpu")
    answer = llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    row.update(_answer_cells(answer[0].outputs[0].text))
    row["b1"] = f"{_speed(llm, 1):.1f}" if speed else "-"
    row["b8"] = f"{_speed(llm, 8):.1f}" if speed else "-"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("extra", nargs="*", help="more checkpoint folders to score")
    ap.add_argument("--no-speed", action="store_true", help="skip the decode-speed columns")
    args = ap.parse_args()
    demo = ensure_demo_model()
    gguf = cache_dir() / "models" / DEMO_GGUF
    model, tok = load_gguf_model(gguf)
    ids = evaluation_token_ids(tok, 2048)
    with torch.no_grad():
        base = {name: perplexity(lambda x: model(x).logits, t, WINDOW) for name, t in ids.items()}
    rows = [("source fp32 (dequantized GGUF)", {"eval": 1.0, "heldout": 1.0, "b1": "-", "b8": "-",
                                                **_answer_cells(source_answer(model, tok))})]
    with tempfile.TemporaryDirectory() as tmp:
        for gs in (32, 64):
            path = write_rtn(gguf, gs, Path(tmp) / f"rtn-g{gs}")
            rows.append((f"RTN g{gs}", score(path, ids, base, not args.no_speed)))
        for path in [demo, *map(Path, args.extra)]:
            name = "demo (shipped)" if path == demo else path.name
            rows.append((name, score(path, ids, base, not args.no_speed)))
    print(f"\nsource perplexity: eval {base['eval']:.3f}, heldout {base['heldout']:.3f} "
          f"(2,048 tokens each, {WINDOW}-token windows)")
    print(f"{'weights':32} {'eval':>7} {'heldout':>7}  {'Paris':5} {'greedy answer':36} "
          f"{'tok/s b1':>8} {'tok/s b8':>8}")
    for name, r in rows:
        print(f"{name:32} {r['eval']:7.4f} {r['heldout']:7.4f}  {r['paris']:5} {r['answer']:36} "
              f"{r['b1']:>8} {r['b8']:>8}")


if __name__ == "__main__":
    main()
