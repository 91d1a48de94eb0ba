"""Bundled calibration and evaluation prose (``edge_llm/data``), and token windows from them."""

from __future__ import annotations

from importlib import resources

import torch


def _read(name: str) -> str:
    return resources.files("edge_llm").joinpath("data", name).read_text(encoding="utf-8")


def load_calibration_texts() -> list[str]:
    """The calibration prose as a list of paragraphs (blank-line separated in the file)."""
    paragraphs = [p.strip() for p in _read("calibration.txt").split("\n\n")]
    return [p for p in paragraphs if p]


def load_eval_text() -> str:
    """The evaluation prose (kept apart from the calibration text) as one string."""
    return _read("eval.txt").strip()


def load_heldout_text() -> str:
    """A second evaluation prose that no quantization setting was tuned on, as one string."""
    return _read("heldout.txt").strip()


def evaluation_token_ids(tokenizer, tokens: int = 2048) -> dict[str, torch.Tensor]:
    """The first ``tokens`` ids (int64, 1-D) of each bundled evaluation text, by name:
    ``"eval"`` (eval.txt, which the demo's quantization settings were tuned on) and
    ``"heldout"`` (heldout.txt, used by no tuning). Both hold more than 2,500 SmolLM2 tokens."""
    if tokens < 2:
        raise ValueError(f"tokens must be >= 2, got {tokens}.")
    texts = {"eval": load_eval_text(), "heldout": load_heldout_text()}
    out = {}
    for name, text in texts.items():
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) < tokens:
            raise ValueError(f"the {name} text has {len(ids)} tokens, fewer than {tokens}.")
        out[name] = torch.tensor(ids[:tokens], dtype=torch.int64)
    return out


def calibration_windows(tokenizer, texts: list[str], nsamples: int, seqlen: int) -> torch.Tensor:
    """``nsamples`` windows of ``seqlen`` token ids, (nsamples, seqlen) int64.

    The texts are joined by blank lines and tokenized once; window starts are spread evenly over
    the token stream, so windows overlap only when ``nsamples * seqlen`` exceeds its length.
    """
    if nsamples < 1 or seqlen < 2:
        raise ValueError(f"nsamples must be >= 1 and seqlen >= 2, got {nsamples}, {seqlen}.")
    if not texts:
        raise ValueError("calib_texts is empty.")
    ids = torch.tensor(tokenizer("\n\n".join(texts))["input_ids"], dtype=torch.int64)
    if ids.numel() < seqlen:
        raise ValueError(
            f"calib_texts hold {ids.numel()} tokens, fewer than seqlen={seqlen}."
        )
    starts = torch.linspace(0, ids.numel() - seqlen, nsamples).round().long()
    return torch.stack([ids[s : s + seqlen] for s in starts.tolist()])  # (nsamples, seqlen)
