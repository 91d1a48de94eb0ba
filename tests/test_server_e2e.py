"""End-to-end: the official ``openai`` client (sync and async) against a real ``edge-llm serve``
process on the demo model (session fixture ``live_server`` in conftest.py)."""

from __future__ import annotations

import asyncio
import random

import openai
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(live_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client) -> str:
    models = client.models.list().data
    assert len(models) == 1 and models[0].id == "SmolLM2-135M-Instruct-AWQ"
    assert client.models.retrieve(models[0].id).id == models[0].id
    return models[0].id


def test_chat_greedy_paris_and_response_shape(client, model):
    r = client.chat.completions.create(model=model, messages=QUESTION, temperature=0,
                                       max_tokens=12)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == model
    (choice,) = r.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_matches_non_stream_greedy(client, model):
    messages = [{"role": "user", "content": "Name three colours."}]
    whole = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                           max_tokens=6)
    chunks = list(client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=6, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.id for c in chunks} == {chunks[0].id}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == whole.choices[0].finish_reason and set(reasons[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        whole.usage.completion_tokens


def test_completions_async_stream_and_not(live_server, model):
    async def run() -> tuple[str, str, object]:
        aclient = openai.AsyncOpenAI(base_url=live_server.url + "/v1", api_key="x",
                                     max_retries=0)
        prompt = "The largest planet in the solar system is"
        whole = await aclient.completions.create(model=model, prompt=prompt, max_tokens=8,
                                                 temperature=0)
        stream = await aclient.completions.create(model=model, prompt=prompt, max_tokens=8,
                                                  temperature=0, stream=True)
        text = "".join([c.choices[0].text async for c in stream])
        await aclient.close()
        return whole.choices[0].text, text, whole

    whole_text, streamed, whole = asyncio.run(run())
    assert whole.id.startswith("cmpl-") and whole.object == "text_completion"
    assert whole_text and streamed == whole_text
    assert whole.usage.completion_tokens == 8 and whole.choices[0].finish_reason == "length"


def test_n2_seeded_sampling_is_reproducible(client, model):
    kw = dict(model=model, messages=[{"role": "user", "content": "Tell me a story."}],
              temperature=1.0, max_tokens=6, n=2)
    seed = random.randrange(1, 2**31)
    # the first request fills the prefix cache; the two compared ones both hit it, so their
    # prompt tails run the same step shapes (on the CPU, bf16 kernels round differently for
    # steps of other sizes, which can move a sampled token)
    client.chat.completions.create(seed=seed, **kw)
    a = client.chat.completions.create(seed=seed, **kw)
    b = client.chat.completions.create(seed=seed, **kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    # the two choices of one request are sampled independently; another seed differs
    other = client.chat.completions.create(seed=seed + 1, **kw)
    texts = {c.message.content for c in a.choices} | {c.message.content for c in other.choices}
    assert len(texts) >= 2
    assert 2 <= a.usage.completion_tokens <= 12  # both choices counted, 6 tokens at most each


def test_logprobs_chat_and_completion_echo(client, model):
    r = client.chat.completions.create(model=model, messages=QUESTION, temperature=0,
                                       max_tokens=5, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert t.logprob == pytest.approx(max(x.logprob for x in t.top_logprobs), abs=1e-4)
    prompt = "Water boils at"
    c = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0,
                                  logprobs=2, echo=True)
    choice = c.choices[0]
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_stop_string_cuts_the_text(client, model):
    kw = dict(model=model, prompt="Count: one, two, three, four, five,", max_tokens=10,
              temperature=0)
    full = client.completions.create(**kw).choices[0].text
    words = [w.strip(" ,.") for w in full.split() if len(w.strip(" ,.")) >= 2]
    assert words, full
    stop = words[min(1, len(words) - 1)]
    cut = client.completions.create(stop=[stop], **kw).choices[0]
    assert cut.finish_reason == "stop" and stop not in cut.text
    assert full.startswith(cut.text)


def test_prompt_token_ids_and_batch(client, model):
    tokens = [504, 3458, 282, 4649, 314]  # token ids, random-ish
    r = client.completions.create(model=model, prompt=[tokens, tokens[:3]], max_tokens=3,
                                  temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.prompt_tokens == 8 and r.usage.completion_tokens == 6


def test_assistant_prefill_is_continued(client, model):
    """vLLM's continue_final_message (through the client's extra_body): the reply continues
    the final assistant message instead of starting a new turn."""
    prefill = [*QUESTION, {"role": "assistant", "content": "The capital of France is"}]
    r = client.chat.completions.create(
        model=model, messages=prefill, temperature=0, max_tokens=6,
        extra_body={"add_generation_prompt": False, "continue_final_message": True})
    assert "Paris" in r.choices[0].message.content
    assert not r.choices[0].message.content.startswith("The capital")


def test_echo_without_generation_scores_the_prompt(client, model):
    """echo with max_tokens 0: the prompt's own logprobs, nothing generated (vLLM's prompt
    scoring); they equal the prompt part of an echo with generation."""
    prompt = "The capital of France is Paris"
    r = client.completions.create(model=model, prompt=prompt, echo=True, max_tokens=0,
                                  logprobs=1, temperature=0)
    (choice,) = r.choices
    assert choice.text == prompt and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.total_tokens == r.usage.prompt_tokens
    lps = choice.logprobs
    assert "".join(lps.tokens) == prompt and lps.token_logprobs[0] is None
    assert len(lps.tokens) == r.usage.prompt_tokens
    assert all(lp < 0 for lp in lps.token_logprobs[1:])
    more = client.completions.create(model=model, prompt=prompt, echo=True, max_tokens=2,
                                     logprobs=1, temperature=0).choices[0].logprobs
    assert more.tokens[: len(lps.tokens)] == lps.tokens
    assert more.token_logprobs[1: len(lps.tokens)] == pytest.approx(lps.token_logprobs[1:],
                                                                   abs=1e-4)
