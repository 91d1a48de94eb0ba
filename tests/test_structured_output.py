"""Constrained decoding: the masked sampler against a reference, matchers through the engine
(batching, preemption by swap and recompute, prefix hits, n > 1), and every refusal."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from edge_llm import LLM, SamplingParams
from edge_llm.engine.sampler import Sampler, SampleRow
from edge_llm.engine.sampler_logits import apply_token_bitmask
from edge_llm.engine.structured_output import GrammarCompiler, fill_bitmasks
from edge_llm.engine.tokenizer import load_tokenizer
from edge_llm.sampling_params import StructuredOutputsParams as SO
from tests.engine_fixtures import demo_dir, tiny_dir  # noqa: F401

VOCAB = 49152
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def compiler(demo_dir):  # noqa: F811
    tok = load_tokenizer(demo_dir)
    return GrammarCompiler(tok, VOCAB, [tok.eos_token_id])


def _allowed(matcher) -> torch.Tensor:
    """The matcher's allowed tokens from llguidance's byte-per-token form (not the bitmask
    path under test): [V] bool."""
    return torch.tensor(np.frombuffer(matcher.compute_logit_bias(), dtype=np.uint8)[:VOCAB] > 0)


def _advanced_matchers(compiler, n: int, rng: np.random.Generator) -> list:
    """n matchers on different grammars, each advanced by a few allowed tokens."""
    specs = [SO(json=PERSON), SO(regex=r"[0-9]{3}-[a-z]{2,5}"), SO(choice=["red", "green"]),
             SO(json_object=True), SO(grammar='start: "x" ("," "y")*')]
    out = []
    for i in range(n):
        m = compiler.compile(specs[i % len(specs)]).matcher()
        for _ in range(int(rng.integers(0, 4))):
            ok = _allowed(m).nonzero().flatten().tolist()
            if m.is_stopped() or not ok:
                break
            assert m.consume_token(int(rng.choice(ok)))
        out.append(m)
    return out


def test_bitmask_op_matches_llguidance_per_token_mask(compiler):
    rng = np.random.default_rng(0)
    matchers = _advanced_matchers(compiler, 7, rng)
    masks = fill_bitmasks(matchers, VOCAB)
    assert masks.shape == (7, VOCAB // 32) and masks.dtype == np.int32
    x = torch.randn(9, VOCAB)
    ref = x.clone()
    rows = [0, 2, 3, 4, 5, 7, 8]  # rows 1 and 6 are unconstrained and must stay untouched
    for r, m in zip(rows, matchers, strict=True):
        ref[r] = ref[r].masked_fill(~_allowed(m), -torch.inf)
    apply_token_bitmask(x, rows, masks)
    assert torch.equal(x, ref)
    assert all(torch.isfinite(x[r]).any() for r in rows)


@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=0.8, top_p=0.9, seed=5),
                                dict(temperature=1.3, top_k=50, repetition_penalty=1.3,
                                     presence_penalty=0.5, seed=11, logprobs=3)])
def test_masked_sampler_equals_reference_on_random_logits(compiler, kw):
    """Sampling with matchers == sampling the reference-masked logits without them (same
    seeds), the tokens are allowed, logprobs see the masked distribution, and unconstrained
    rows in the batch get exactly what they get alone."""
    rng = np.random.default_rng(1)
    matchers = _advanced_matchers(compiler, 5, rng)
    logits = torch.randn(8, VOCAB) * 4
    constrained = {1: 0, 2: 1, 4: 2, 5: 3, 7: 4}  # row -> matcher
    params = SamplingParams(**kw)

    def rows(with_matchers: bool) -> list[SampleRow]:
        return [SampleRow(params, [5, 6], [7], key, key, matchers[constrained[key]]
                          if with_matchers and key in constrained else None)
                for key in range(8)]

    masked = logits.clone()
    for r, i in constrained.items():
        masked[r] = masked[r].masked_fill(~_allowed(matchers[i]), -torch.inf)
    got = Sampler(seed=3)(logits, rows(True))
    want = Sampler(seed=3)(masked, rows(False))
    assert got.token_ids == want.token_ids
    for r, i in constrained.items():
        assert _allowed(matchers[i])[got.token_ids[r]]
    if params.logprobs is not None:
        for a, b in zip(got.logprobs, want.logprobs, strict=True):
            assert a.keys() == b.keys()
            assert all(a[t].logprob == b[t].logprob or abs(a[t].logprob - b[t].logprob) < 1e-5
                       for t in a)
        for r, i in constrained.items():  # a disallowed token reads -inf
            assert all(lp.logprob == -torch.inf for t, lp in got.logprobs[r].items()
                       if not _allowed(matchers[i])[t])
    plain = Sampler(seed=3)(logits, rows(False))
    if params.seed is not None or params.temperature == 0.0:  # independent of the batch
        assert [plain.token_ids[r] for r in (0, 3, 6)] == [got.token_ids[r] for r in (0, 3, 6)]


def test_constrained_rows_are_not_chainable_or_plain_greedy(compiler):
    m = compiler.compile(SO(choice=["a"])).matcher()
    row = SampleRow(SamplingParams(temperature=0.0), [1], [], 0, 0, m)
    assert not Sampler.chainable(row)  # decode run-ahead waits for the previous token


# ---- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,needle", [
    (SO(json={"not": {"type": "string"}}), '"not"'),
    (SO(json={"type": "object", "dependentRequired": {"a": ["b"]}}), "dependentRequired"),
    (SO(json={"type": "string", "pattern": "a(?=b)"}), "look-around"),
    (SO(json={"$ref": "#/$defs/missing"}), "/$defs/missing"),
    (SO(json="{not json"), "not JSON"),
    (SO(json={"type": "strin"}), "strin"),
    (SO(regex="a(b"), "unclosed group"),
    (SO(grammar="start: (("), "start"),
    (SO(grammar='root ::= ("a"'), "bad GBNF"),
])
def test_unenforceable_constraints_are_refused_naming_the_reason(compiler, spec, needle):
    with pytest.raises(ValueError) as err:
        compiler.compile(spec)
    assert needle in str(err.value)


@pytest.mark.parametrize("kw,needle", [
    (dict(), "exactly one"), (dict(json={}, regex="a"), "exactly one"),
    (dict(choice=[]), "choice"), (dict(choice=[1]), "choice"), (dict(regex=""), "regex"),
])
def test_bad_structured_outputs_params_are_refused(kw, needle):
    with pytest.raises(ValueError, match=needle):
        SO(**kw)


def test_sampling_params_take_the_dict_form():
    p = SamplingParams(structured_outputs={"regex": "a+"})
    assert p.structured_outputs == SO(regex="a+")
    assert p.clone().structured_outputs == p.structured_outputs


# ---- the engine ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_llm(tiny_dir):  # noqa: F811
    return LLM(str(tiny_dir), device="cpu", max_num_batched_tokens=256, block_size=16)


def _prompts(n: int, seed: int, lo: int = 10, hi: int = 40) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"prompt_token_ids": rng.integers(100, 40000, int(rng.integers(lo, hi))).tolist()}
            for _ in range(n)]


def _assert_follows(llm: LLM, spec: SO, out) -> None:
    """The tokens replay through a fresh matcher; a reply that stopped is complete."""
    grammars = llm.engine.grammars
    m = grammars.compile(spec).matcher()
    tokens = list(out.token_ids)
    if out.finish_reason == "stop" and tokens and tokens[-1] in llm.engine.eos_token_ids:
        tokens = tokens[:-1]
        assert m.consume_tokens(tokens), out
        assert m.is_accepting(), out
    else:
        assert m.consume_tokens(tokens), out


REGEX = SO(regex=r"(yes|no)( (yes|no|maybe)){0,30}\.")


def test_constrained_and_free_rows_batch_together(tiny_llm):
    prompts = _prompts(8, seed=2)
    specs = [REGEX, None, SO(json=PERSON), None, SO(choice=["left", "right"]), None, REGEX, None]
    params = [SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=s)
              for s in specs]
    outs = tiny_llm.generate(prompts, params, use_tqdm=False)
    alone = [tiny_llm.generate([p], [sp], use_tqdm=False)[0] for p, sp in zip(prompts, params,
                                                                             strict=True)]
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in alone]
    for spec, o in zip(specs, outs, strict=True):
        if spec is not None:
            _assert_follows(tiny_llm, spec, o.outputs[0])
    assert re.fullmatch(r"(yes|no)( (yes|no|maybe))*\.?", outs[0].outputs[0].text.strip())
    assert outs[4].outputs[0].text in ("left", "right")
    assert outs[4].outputs[0].finish_reason == "stop"  # EOS once the choice is complete


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_matcher_state_survives_preemption(tiny_dir, tiny_llm, mode):  # noqa: F811
    prompts = _prompts(10, seed=3)
    params = SamplingParams(max_tokens=30, temperature=0.0, structured_outputs=REGEX)
    ref = tiny_llm.generate(prompts, params, use_tqdm=False)
    small = LLM(str(tiny_dir), device="cpu", block_size=8, num_gpu_blocks_override=24,
                swap_space=1.0, max_num_batched_tokens=128, max_num_seqs=16,
                max_model_len=160, growth_reserve=0, preemption_mode=mode)
    outs = small.generate(prompts, params, use_tqdm=False)
    assert small.engine.scheduler.stats()["num_preemptions"] > 0
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]
    for o in outs:
        _assert_follows(small, REGEX, o.outputs[0])


def test_matcher_state_with_prefix_cache_hits(tiny_llm):
    rng = np.random.default_rng(7)
    prefix = rng.integers(100, 40000, 200).tolist()
    params = SamplingParams(max_tokens=20, temperature=0.0, structured_outputs=SO(json=PERSON))
    first = tiny_llm.generate([{"prompt_token_ids": prefix + [11]}], params, use_tqdm=False)[0]
    again = tiny_llm.generate([{"prompt_token_ids": prefix + [11]}], params, use_tqdm=False)[0]
    assert again.num_cached_tokens >= 192
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    _assert_follows(tiny_llm, SO(json=PERSON), again.outputs[0])


def test_n_choices_each_follow_their_own_matcher(tiny_llm):
    spec = SO(json=PERSON)
    params = SamplingParams(n=4, max_tokens=40, temperature=1.0, seed=4, structured_outputs=spec)
    (out,) = tiny_llm.generate(_prompts(1, seed=5), params, use_tqdm=False)
    assert len(out.outputs) == 4
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    for c in out.outputs:
        _assert_follows(tiny_llm, spec, c)
        if c.finish_reason == "stop":
            doc = json.loads(c.text)
            assert set(doc) >= {"name", "age"} and 0 <= doc["age"] <= 150


def test_max_tokens_cuts_with_length_and_stop_strings_work(tiny_llm):
    spec = SO(regex=r"(ab){20,}c")
    (cut,) = tiny_llm.generate(_prompts(1, seed=6), SamplingParams(
        max_tokens=3, temperature=0.0, structured_outputs=spec), use_tqdm=False)
    assert cut.outputs[0].finish_reason == "length" and len(cut.outputs[0].token_ids) == 3
    (stopped,) = tiny_llm.generate(_prompts(1, seed=6), SamplingParams(
        max_tokens=40, temperature=0.0, structured_outputs=SO(regex=r"a{1,40}"), stop=["aaa"]),
        use_tqdm=False)
    assert stopped.outputs[0].finish_reason == "stop"
    assert "aaa" not in stopped.outputs[0].text and set(stopped.outputs[0].text) <= {"a"}


def test_min_tokens_cannot_push_a_row_past_its_grammar(tiny_llm):
    """The grammar allows only EOS before min_tokens is reached: EOS it is (no NaN row)."""
    params = SamplingParams(max_tokens=10, min_tokens=5, temperature=0.7, seed=2,
                            structured_outputs=SO(choice=["ok"]))
    (out,) = tiny_llm.generate(_prompts(1, seed=4), params, use_tqdm=False)
    c = out.outputs[0]
    assert c.text == "ok" and c.finish_reason == "stop" and len(c.token_ids) == 5
    eos = tiny_llm.engine.eos_token_ids
    text_ids = [t for t in c.token_ids if t not in eos]
    assert tiny_llm.get_tokenizer().decode(text_ids) == "ok"
    assert all(t in eos for t in c.token_ids[len(text_ids):])


def test_engine_refuses_an_unenforceable_schema_and_keeps_nothing(tiny_llm):
    params = SamplingParams(structured_outputs=SO(json={"not": {}}))
    with pytest.raises(ValueError, match="not"):
        tiny_llm.generate(_prompts(1, seed=1), params, use_tqdm=False)
    assert not tiny_llm.engine.has_unfinished()
    tiny_llm.engine.scheduler.check_integrity()
