"""Quality of the shipped demo checkpoint against its own source and against round-to-nearest.

Perplexity on 2,048 tokens of each bundled evaluation text (512-token windows), as a ratio to
the dequantized fp32 GGUF source: the demo (read through edge-llm's loader and decoder) must stay
within +10% on the held-out text, which no setting was tuned on, and on the tuning text;
round-to-nearest at group 32 (better than at 64; benchmarks/demo.py prints both) must do clearly
worse. The greedy "Paris" answer is checked in tests/test_engine.py.
"""

from __future__ import annotations

import pytest
import torch

from edge_llm.model.demo import DEMO_GGUF, load_gguf_model
from edge_llm.model.full_forward import full_logits
from edge_llm.model.loader import load_model
from edge_llm.quant import (
    evaluation_token_ids,
    load_calibration_texts,
    load_eval_text,
    load_heldout_text,
    perplexity,
    quantize_model,
)
from tests.engine_fixtures import demo_dir  # noqa: F401

WINDOW = 512


@pytest.fixture(scope="module")
def ratios(demo_dir):  # noqa: F811
    """{"demo" | "rtn-g32": {"eval": ratio, "heldout": ratio}}."""
    model, tok = load_gguf_model(demo_dir.parent / DEMO_GGUF)
    ids = evaluation_token_ids(tok, 2048)

    def hf_ppl() -> dict[str, float]:
        with torch.no_grad():
            return {k: perplexity(lambda x: model(x).logits, t, WINDOW) for k, t in ids.items()}

    base = hf_ppl()
    demo = load_model(str(demo_dir), device="cpu", progress=False).model
    out = {"demo": {k: perplexity(lambda x: full_logits(demo, x[0]), t, WINDOW) / base[k]
                    for k, t in ids.items()}}
    quantize_model(model, tok, fmt="awq", method="rtn", group_size=32)  # weights in place
    out["rtn-g32"] = {k: v / base[k] for k, v in hf_ppl().items()}
    return out


def test_demo_within_ten_percent_on_both_texts(ratios):
    demo = ratios["demo"]
    assert 1.0 < demo["heldout"] < 1.10, demo
    assert 1.0 < demo["eval"] < 1.10, demo


def test_round_to_nearest_is_clearly_worse(ratios):
    for text in ("eval", "heldout"):
        demo, plain = ratios["demo"][text], ratios["rtn-g32"][text]
        # calibration must remove at least half of round-to-nearest's excess perplexity
        assert demo - 1.0 < 0.5 * (plain - 1.0), (text, demo, plain)


class _ByteTokenizer:
    """One id per UTF-8 byte: enough to check lengths and slicing without a model."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))


def _word_runs(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = text.lower().split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_heldout_text_is_its_own_prose():
    held = load_heldout_text()
    assert len(held.split()) >= 2000
    assert not _word_runs(held) & _word_runs(load_eval_text())
    assert not _word_runs(held) & _word_runs("\n\n".join(load_calibration_texts()))
    ids = evaluation_token_ids(_ByteTokenizer(), 3000)
    assert sorted(ids) == ["eval", "heldout"]
    assert ids["heldout"].dtype == torch.int64 and ids["heldout"].shape == (3000,)
    assert bytes(ids["heldout"].tolist()) == held.encode("utf-8")[:3000]
    with pytest.raises(ValueError, match="fewer than"):
        evaluation_token_ids(_ByteTokenizer(), 10**6)
    with pytest.raises(ValueError, match="tokens must be"):
        evaluation_token_ids(_ByteTokenizer(), 1)
