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
