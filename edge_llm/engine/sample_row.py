"""``SampleRow``: what the sampler knows about the sequence behind one row of the logits.

Its own module so that ``sampler`` (the order of operations) and ``sampler_logits`` (the
operations) both import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge_llm.sampling_params import SamplingParams


@dataclass
class SampleRow:
    """One row of the logits.

    ``generator_key`` is the sequence id: it names the row's generator when ``params.seed`` is
    set. ``choice_index`` is the choice's index among the request's ``n`` (seed derivation).
    ``matcher`` is the sequence's llguidance matcher when its output is constrained
    (``structured_output.py``): only the tokens it allows next can be sampled.
    """

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator_key: int
    choice_index: int = 0
    matcher: Any = None
