"""The one-row GEMV's split sums handed to the residual add + RMSNorm (kernels/splitk.py
``Partials``): the model asks the o and down projections for them only where an add + RMSNorm
reads the branch (not Gemma 2's sandwich norms), and the function it computes is unchanged.

On the CPU a stand-in for ``QuantLinear.forward_partials`` (which returns None there) splits
the projection's output into three random fp32 parts; the reference add + RMSNorm sums them
(``Partials.total``). The kernels' side of the contract: tests/test_kernels_fused_interpret.py
(the norm adds the parts as it reads them) and tests/test_w4a16_interpret.py (the GEMV leaves
them unsummed); both together on a GPU: tests/test_splitk_gpu.py."""

from __future__ import annotations

import pytest
import torch

from edge_llm.kernels.splitk import Partials
from edge_llm.model.loader import load_model
from edge_llm.quant.linear import QuantLinear
from tests.helpers import rel_err, tiny_hf_model
from tests.test_model_parity import run_prefill_then_decode
from tests.test_model_quant_parity import CASES, _quantized_checkpoint


def _logits(lm, ids):
    torch.manual_seed(3)  # run_prefill_then_decode fills the caches at random
    return run_prefill_then_decode(lm, ids)


@pytest.mark.parametrize("arch,asked", [("LlamaForCausalLM", True),
                                        ("Gemma2ForCausalLM", False)])
def test_projections_hand_split_sums_to_the_add_norm_only(arch, asked, tmp_path,
                                                           monkeypatch):
    hf = tiny_hf_model(arch)
    path = _quantized_checkpoint(hf, CASES[0], tmp_path / "ckpt")
    lm = load_model(str(path), device="cpu", dtype="float32", progress=False).model
    ids = torch.randint(0, hf.config.vocab_size, (20,), generator=torch.Generator().manual_seed(1))
    plain = _logits(lm, ids)
    names = {mod: name for name, mod in lm.named_modules()}
    asked_for: list[str] = []

    def split_sums(self, x):
        asked_for.append(names[self].rsplit(".", 1)[-1])
        y = self.forward(x).float()
        a = torch.rand(y.shape) * 2 - 0.5
        return Partials(torch.stack([y * a, y - y * a, torch.zeros_like(y)]), x.dtype)

    monkeypatch.setattr(QuantLinear, "forward_partials", split_sums)
    split = _logits(lm, ids)
    layers = len(lm.model.layers)
    if asked:  # o and down of every layer, in each of the three forwards
        assert sorted(set(asked_for)) == ["down_proj", "o_proj"]
        assert len(asked_for) == 3 * 2 * layers
    else:
        assert asked_for == []
    assert rel_err(split, plain) < 1e-5
