"""Wall time of ``load_tokenizer`` in fresh processes: the tokenizers fast path vs transformers.

    python benchmarks/tokenizer_load.py [--model DIR | --random-vocab 32000] [--runs 3]
                                        [--out FILE.json]

Each run is a new Python process (nothing cached in memory; the files are in the page cache
after the first run). Modes: ``fast`` / ``transformers`` (``use_fast_path=False``), each alone
and after ``import torch`` (the server has imported torch by the time it loads the tokenizer,
so the second figure is the one a cold start pays). A run also times the first chat-template
render plus encode (jinja2 is imported on first use). ``--random-vocab N``: the word-level
tokenizer of the random benchmark checkpoints (``random_checkpoint.write_tokenizer``, what the
7B cold start loads) in a temporary folder. Neither: the demo model.
Prints one JSON object: per mode the median seconds and all runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = ("fast", "transformers", "fast+torch", "transformers+torch")

_CHILD = """
import json, sys, time
if {torch}:
    import torch  # noqa: F401
t0 = time.perf_counter()
from pathlib import Path
from edge_llm.engine.tokenizer import load_tokenizer
tok = load_tokenizer(Path({path!r}), use_fast_path={fast})
t1 = time.perf_counter()
if getattr(tok, "chat_template", None):
    text = tok.apply_chat_template([{{"role": "user", "content": "Hello!"}}], tokenize=False,
                                   add_generation_prompt=True)
    tok.encode(text, add_special_tokens=False)
t2 = time.perf_counter()
print(json.dumps({{"load_s": t1 - t0, "first_chat_s": t2 - t1, "type": type(tok).__name__,
                  "transformers_imported": "transformers" in sys.modules}}))
"""


def one_run(model: Path, mode: str) -> dict:
    code = _CHILD.format(torch="torch" in mode, path=str(model), fast=mode.startswith("fast"))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=300, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(model: Path, runs: int, modes: tuple[str, ...] = MODES) -> dict:
    result: dict = {"model": str(model), "runs": runs}
    for mode in modes:
        samples = [one_run(model, mode) for _ in range(runs)]
        result[mode] = {
            "load_s_median": statistics.median(s["load_s"] for s in samples),
            "first_chat_s_median": statistics.median(s["first_chat_s"] for s in samples),
            "type": samples[0]["type"],
            "transformers_imported": samples[0]["transformers_imported"],
            "load_s": [round(s["load_s"], 4) for s in samples],
        }
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="model folder (default: the demo)")
    ap.add_argument("--random-vocab", type=int, default=None,
                    help="time the random checkpoints' word-level tokenizer of this vocabulary")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {MODES}")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    modes = tuple(m for m in args.modes.split(",") if m)
    unknown = set(modes) - set(MODES)
    if unknown or args.runs < 1:
        ap.error(f"unknown modes {sorted(unknown)} or runs < 1")
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if args.random_vocab is not None:
            from benchmarks.random_checkpoint import write_tokenizer

            model = Path(tmp)
            write_tokenizer(model, args.random_vocab)
            (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
        elif model is None:
            from edge_llm.model.demo import ensure_demo_model

            model = ensure_demo_model()
        result = measure(model, args.runs, modes)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
