"""vLLM's offline semantics on the demo model: finish reasons, request validation that protects
the rest of a batch, min_tokens with ignore_eos, prompt logprobs of a one-token prompt,
LLM.chat's template options, and SamplingParams values vLLM accepts."""

from __future__ import annotations

import pytest

from edge_llm import LLM, SamplingParams
from tests.engine_fixtures import demo_dir  # noqa: F401

GREEDY = dict(temperature=0.0)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llm(demo_dir):  # noqa: F811
    return LLM(str(demo_dir), max_model_len=256)


def _idle(llm: LLM) -> bool:
    st = llm.engine.stats()
    return not llm.engine.has_unfinished() and st["num_free_blocks"] == st["num_total_blocks"]


def test_stop_string_completed_by_the_last_allowed_token_is_a_stop(llm):
    prompt = "Count: 1, 2, 3,"
    for k in (2, 3, 5):
        free = llm.generate([prompt], SamplingParams(max_tokens=k, ignore_eos=True, **GREEDY))
        out = free[0].outputs[0]
        last = llm.engine.tokenizer.decode(out.token_ids[-1:]).strip()
        if not last or last in llm.engine.tokenizer.decode(out.token_ids[:-1]):
            continue  # the stop would match earlier, or a whitespace token: try another k
        stopped = llm.generate([prompt], SamplingParams(max_tokens=k, ignore_eos=True, stop=[last],
                                                        **GREEDY))[0].outputs[0]
        assert (stopped.finish_reason, stopped.stop_reason) == ("stop", last)
        assert stopped.text == out.text[: out.text.rindex(last)]
        break
    else:
        pytest.fail("no length with a usable last token")


def test_out_of_vocab_ids_are_refused_before_the_batch_runs(llm):
    vocab = llm.engine.loaded.arch.vocab_size
    good = SamplingParams(max_tokens=4, **GREEDY)
    for bad in (SamplingParams(max_tokens=4, logit_bias={vocab + 10: 1.0}),
                SamplingParams(max_tokens=4, stop_token_ids=[vocab], min_tokens=2)):
        with pytest.raises(ValueError, match=r"outside \[0, 49152\)"):
            llm.generate(["Hello", "The sky is"], [good, bad])
        assert _idle(llm)
    assert len(llm.generate(["Hello"], good)[0].outputs[0].token_ids) == 4


def test_min_tokens_holds_eos_back_with_ignore_eos_too(llm):
    (eos,) = sorted(llm.engine.eos_token_ids)[:1]
    params = SamplingParams(max_tokens=6, min_tokens=3, ignore_eos=True, logit_bias={eos: 100.0},
                            **GREEDY)
    ids = llm.generate(["Hi"], params)[0].outputs[0].token_ids
    assert eos not in ids[:3] and ids[3:] == [eos] * 3


def test_prompt_logprobs_of_a_one_token_prompt(llm):
    out = llm.generate([{"prompt_token_ids": [504]}], SamplingParams(max_tokens=1,
                                                                      prompt_logprobs=1))
    assert out[0].prompt_logprobs == [None]
    two = llm.generate([{"prompt_token_ids": [504, 33]}], SamplingParams(max_tokens=1,
                                                                         prompt_logprobs=1))
    assert two[0].prompt_logprobs[0] is None and 33 in two[0].prompt_logprobs[1]


def test_chat_continues_the_final_message_and_takes_template_options(llm):
    params = SamplingParams(max_tokens=4, **GREEDY)
    prefill = [*QUESTION, {"role": "assistant", "content": "The capital of France is"}]
    out = llm.chat(prefill, params, add_generation_prompt=False, continue_final_message=True)
    assert out[0].prompt.endswith("assistant\nThe capital of France is")
    assert "Paris" in out[0].outputs[0].text
    template = ("{% if formal %}Dear model. {% endif %}{% for m in messages %}{{ m['content'] }}"
                "{% endfor %}{% if tools %} [{{ tools | length }} tools]{% endif %} Answer:")
    out = llm.chat(QUESTION, params, chat_template=template, chat_template_kwargs={"formal": True},
                   tools=[{"type": "function", "function": {"name": "f"}}])
    assert out[0].prompt == "Dear model. What is the capital of France? [1 tools] Answer:"
    with pytest.raises(ValueError, match="cannot both be True"):
        llm.chat(prefill, params, continue_final_message=True)
    with pytest.raises(ValueError, match="at least one message"):
        llm.chat([], params)
    assert _idle(llm)


def test_sampling_params_values_vllm_accepts_or_refuses(llm):
    assert SamplingParams(seed=-1).seed is None  # vLLM's "no seed"
    assert SamplingParams(repetition_penalty=2.5).repetition_penalty == 2.5
    for kw, field in ((dict(repetition_penalty=0.0), "repetition_penalty"),
                      (dict(repetition_penalty=float("inf")), "repetition_penalty"),
                      (dict(temperature="0.5"), "temperature"),
                      (dict(top_p=None), "top_p"),
                      (dict(detokenize=False, stop=["x"]), "detokenize")):
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kw)
    out = llm.generate(["Hi"], SamplingParams(max_tokens=3, detokenize=False, **GREEDY))
    assert out[0].outputs[0].text == "" and len(out[0].outputs[0].token_ids) == 3
    # the engine's copy of a request's params (clone) is equal and shares no container
    p = SamplingParams(stop=["a"], stop_token_ids=[1], logit_bias={3: 1.0},
                       allowed_token_ids=[1, 3], max_tokens=8)
    c = p.clone()
    assert c == p and c is not p
    c.stop.append("b")
    c.stop_token_ids.append(2)
    c.logit_bias[4] = 2.0
    c.allowed_token_ids.append(4)
    c.all_stop_token_ids.add(9)
    assert (p.stop, p.stop_token_ids, p.logit_bias, p.allowed_token_ids) == (
        ["a"], [1], {3: 1.0}, [1, 3]) and p.all_stop_token_ids == {1}


def test_logprobs_are_vllm_logprob_objects(llm):
    """``.logprob``, ``.rank`` and ``.decoded_token`` as vLLM's Logprob, still usable as the
    float itself; ranks agree with the full distribution."""
    import copy
    import pickle

    import torch

    from edge_llm.engine.sampler import compute_prompt_logprobs
    from edge_llm.outputs import Logprob

    out = llm.generate(["The capital of France is"],
                       SamplingParams(max_tokens=4, logprobs=3, prompt_logprobs=2, seed=7))[0]
    tok = llm.engine.tokenizer
    for tid, lps in zip(out.outputs[0].token_ids, out.outputs[0].logprobs, strict=True):
        assert tid in lps and len(lps) in (3, 4)
        for other, lp in lps.items():
            assert isinstance(lp, Logprob) and lp.logprob == float(lp) <= 0
            assert lp.decoded_token == tok.decode([other], skip_special_tokens=False)
        # the top 3 are ranks 1..3; the sampled token, if not among them, ranks below
        by_rank = sorted(lps.values(), key=lambda lp: lp.rank)
        assert [lp.rank for lp in by_rank][:3] == [1, 2, 3] and by_rank[-1].rank >= len(lps)
        assert all(a >= b for a, b in zip(by_rank, by_rank[1:], strict=False))
    assert out.outputs[0].cumulative_logprob == pytest.approx(
        sum(lps[t] for t, lps in zip(out.outputs[0].token_ids, out.outputs[0].logprobs,
                                     strict=True)), abs=1e-6)
    assert out.prompt_logprobs[0] is None
    for pid, lps in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:], strict=True):
        assert lps[pid].decoded_token == tok.decode([pid], skip_special_tokens=False)
    # the rank is the number of tokens more likely than it, plus one
    logits = torch.randn(5, 40)
    targets = [3, 17, 0, 39, 8]
    for t, entry in enumerate(compute_prompt_logprobs(logits, targets, 2)):
        assert entry[targets[t]].rank == int((logits[t] > logits[t, targets[t]]).sum()) + 1
    lp = out.outputs[0].logprobs[0][out.outputs[0].token_ids[0]]
    for clone in (copy.deepcopy(lp), pickle.loads(pickle.dumps(lp))):
        assert (clone.logprob, clone.rank, clone.decoded_token) == (
            lp.logprob, lp.rank, lp.decoded_token)


def test_allowed_token_ids_and_prompt_truncation(llm):
    allowed = [504, 7042, 33, 260]
    for extra in (GREEDY, dict(temperature=1.0, seed=3), dict(temperature=0.8, top_k=2, seed=4)):
        out = llm.generate(["The capital of France is"],
                           SamplingParams(max_tokens=6, allowed_token_ids=allowed,
                                          ignore_eos=True, logprobs=1, **extra))[0].outputs[0]
        assert set(out.token_ids) <= set(allowed), (extra, out.token_ids)
        assert all(lps[t] > float("-inf") for t, lps in zip(out.token_ids, out.logprobs,
                                                             strict=True))
    with pytest.raises(ValueError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=[])
    with pytest.raises(ValueError, match=r"allowed_token_ids holds token id\(s\) \[49152\]"):
        llm.generate(["Hi"], SamplingParams(allowed_token_ids=[5, 49152]))
    ids = list(range(300, 340))
    for keep, want in ((8, ids[-8:]), (100, ids), (-1, ids)):
        out = llm.generate([{"prompt_token_ids": ids}],
                           SamplingParams(max_tokens=2, truncate_prompt_tokens=keep, **GREEDY))
        assert out[0].prompt_token_ids == want
    alone = llm.generate([{"prompt_token_ids": ids[-8:]}], SamplingParams(max_tokens=2, **GREEDY))
    assert alone[0].outputs[0].token_ids == llm.generate(
        [{"prompt_token_ids": ids}], SamplingParams(max_tokens=2, truncate_prompt_tokens=8,
                                                    **GREEDY))[0].outputs[0].token_ids
    for bad in (0, -2, True):
        with pytest.raises(ValueError, match="truncate_prompt_tokens"):
            SamplingParams(truncate_prompt_tokens=bad)
    assert _idle(llm)


def test_preemptions_are_counted_per_request(demo_dir):  # noqa: F811
    """``RequestOutput.metrics.num_preemptions``: how often the request was preempted (a
    cache of 10 blocks for 4 requests that need 5 each), summing to the engine's count."""
    small = LLM(str(demo_dir), max_model_len=128, growth_reserve=0, swap_space=0,
                kv_cache_memory=10 * 16 * 30 * 2 * 3 * 64 * 2)  # bf16: the CPU's 4-bit dtype
    assert small.engine.stats()["num_total_blocks"] == 10
    prompts = [{"prompt_token_ids": list(range(300 + 40 * i, 340 + 40 * i))} for i in range(4)]
    outs = small.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True, **GREEDY))
    counts = [o.metrics.num_preemptions for o in outs]
    assert sum(counts) == small.engine.stats()["num_preemptions"] > 0, counts
    assert all(len(o.outputs[0].token_ids) == 40 for o in outs)
