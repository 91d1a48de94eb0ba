"""Each family's chat template and stop tokens, through ``LLM.chat`` and a real server app
(Litestar's AsyncTestClient over the real engine), on tiny random checkpoints of the family
with a byte-level tokenizer that carries the family's special tokens and chat template.

* the prompt is the template rendered as transformers renders it (``AutoTokenizer``'s
  ``apply_chat_template`` on the same folder), token for token;
* the family's end-of-turn token ends generation (forced with a logit bias), with and without
  a generation_config.json listing it (4-bit re-uploads often lack the file);
* Gemma 2's template refusing a system message: a 400 error from the server, the
  template's exception from ``LLM.chat``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from edge_llm.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
)
from edge_llm.engine.llm import LLM
from edge_llm.sampling_params import SamplingParams
from edge_llm.server.app import create_app
from tests.helpers import save_hf_checkpoint, tiny_hf_model
from tests.test_server_fake_engine import TEST_CLIENT_HOSTS

GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
    "not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == "
    "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must "
    "alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == "
    "'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + "
    "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{'<start_of_turn>model\n'}}{% endif %}")

GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")

PHI4_TEMPLATE = (
    "{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system"
    "<|im_sep|>' + message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}"
    "{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'}}{% elif "
    "(message['role'] == 'assistant') %}{{'<|im_start|>assistant<|im_sep|>' + "
    "message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}")

NEMO_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST]' + message['content'] + '[/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token }}{% endif %}{% endfor %}")

# case -> (architecture case of tests/helpers.py, template, special tokens after the 256
# bytes, bos, eos, the token that ends an assistant turn)
FAMILIES = {
    "gemma2": ("Gemma2ForCausalLM", GEMMA2_TEMPLATE,
               ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
               "<bos>", "<eos>", "<end_of_turn>"),
    "gemma3": ("Gemma3ForCausalLM", GEMMA3_TEMPLATE,
               ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
               "<bos>", "<eos>", "<end_of_turn>"),
    "phi3": ("Phi3ForCausalLM", PHI3_TEMPLATE,
             ["<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
             "<s>", "<|endoftext|>", "<|end|>"),
    "phi4": ("Phi3ForCausalLM", PHI4_TEMPLATE,
             ["<|endoftext|>", "<|im_start|>", "<|im_sep|>", "<|im_end|>"],
             None, "<|endoftext|>", "<|im_end|>"),
    "mistral-nemo": ("MistralNemo", NEMO_TEMPLATE, ["<s>", "</s>", "[INST]", "[/INST]"],
                     "<s>", "</s>", "</s>"),
}
MESSAGES = [{"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Name a colour."}]


def _tokenizer_files(out: Path, specials: list[str], bos: str | None, eos: str,
                     template: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tk = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(specials)
    tk.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
        "chat_template": template, "add_bos_token": False, "add_eos_token": False}))


def family_checkpoint(case: str, out: Path, generation_config: bool = True) -> tuple[Path, int]:
    """A tiny random checkpoint of ``case`` with its tokenizer; (folder, end-of-turn id)."""
    arch, template, specials, bos, eos, eot = FAMILIES[case]
    hf = tiny_hf_model(arch, vocab=256 + len(specials))
    ids = {t: 256 + i for i, t in enumerate(specials)}
    hf.config.eos_token_id = ids[eos]
    hf.config.bos_token_id = ids[bos] if bos else None
    hf.config.pad_token_id = None
    save_hf_checkpoint(hf, out)
    _tokenizer_files(out, specials, bos, eos, template)
    if generation_config:
        (out / "generation_config.json").write_text(json.dumps(
            {"eos_token_id": sorted({ids[eos], ids[eot]})}))
    return out, ids[eot]


def _hf_prompt_ids(path: Path, messages) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("generation_config", [True, False], ids=["gen-config", "no-gen-config"])
@pytest.mark.parametrize("case", list(FAMILIES))
def test_llm_chat_renders_the_template_and_stops_at_the_turn_end(case, generation_config,
                                                                 tmp_path):
    path, eot = family_checkpoint(case, tmp_path / case, generation_config)
    llm = LLM(str(path), device="cpu", dtype="float32", max_num_batched_tokens=256, swap_space=0)
    free = llm.chat(MESSAGES, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                    use_tqdm=False)[0]
    assert free.prompt_token_ids == _hf_prompt_ids(path, MESSAGES)
    assert len(free.outputs[0].token_ids) == 4  # the bias below is what stops it
    out = llm.chat(MESSAGES, SamplingParams(max_tokens=4, temperature=0,
                                            logit_bias={eot: 100.0}), use_tqdm=False)[0]
    done = out.outputs[0]
    assert done.finish_reason == "stop" and done.text == "", (case, done)
    assert list(done.token_ids) == [eot]


def test_gemma2_template_refuses_a_system_message(tmp_path):
    """As with transformers: the template's own exception, its message intact."""
    import jinja2

    path, _ = family_checkpoint("gemma2", tmp_path / "g")
    llm = LLM(str(path), device="cpu", dtype="float32", max_num_batched_tokens=256, swap_space=0)
    with pytest.raises(jinja2.TemplateError, match="System role not supported"):
        llm.chat([{"role": "system", "content": "Be brief."}, *MESSAGES], use_tqdm=False)


@pytest.mark.anyio
@pytest.mark.parametrize("case", ["gemma2", "phi3"])
async def test_served_chat_stops_at_the_turn_end(case, tmp_path):
    """``edge-llm serve``'s app over the real engine: the chat prompt's usage is the template's
    token count, the end-of-turn token ends the reply with finish_reason "stop", and Gemma 2's
    refusal of a system message is a 400 with the template's message."""
    path, eot = family_checkpoint(case, tmp_path / case, generation_config=False)
    cfg = EngineConfig(model=ModelConfig(model=str(path), device="cpu"),
                       cache=CacheConfig(swap_space=0),
                       scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256))
    app = create_app(cfg, ServerConfig(allowed_hosts=TEST_CLIENT_HOSTS))
    async with AsyncTestClient(app) as c:
        r = await c.post("/v1/chat/completions", json={
            "model": path.name, "messages": MESSAGES, "max_tokens": 4, "temperature": 0,
            "logit_bias": {str(eot): 100}})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["choices"][0]["message"]["content"] == ""
        assert body["usage"]["prompt_tokens"] == len(_hf_prompt_ids(path, MESSAGES))
        assert body["usage"]["completion_tokens"] == 1
        if case == "gemma2":
            r = await c.post("/v1/chat/completions", json={
                "model": path.name, "max_tokens": 4,
                "messages": [{"role": "system", "content": "Be brief."}, *MESSAGES]})
            assert r.status_code == 400 and "System role not supported" in r.text, r.text


@pytest.mark.parametrize("case", ["gemma2", "gemma3", "phi3"])
def test_engine_generates_past_the_window_as_transformers(case, tmp_path):
    """The whole engine (scheduler, paged cache in 16-token blocks, chunked prefill, decode
    steps) on a sliding-window family: a 30-token prompt and 30 greedy tokens, past the
    window (8 or 24 positions), give transformers' greedy continuation; the context limit is
    the model's, not its window."""
    import torch

    path, _ = family_checkpoint(case, tmp_path / case)
    cfg = json.loads((path / "config.json").read_text())
    llm = LLM(str(path), device="cpu", dtype="float32", max_num_batched_tokens=16, max_num_seqs=4,
              swap_space=0)
    assert llm.engine.max_model_len == cfg["max_position_embeddings"]
    prompt = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(5)).tolist()
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    hf = tiny_hf_model(FAMILIES[case][0], vocab=256 + len(FAMILIES[case][2]))
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False,
                          min_new_tokens=30)[0, 30:].tolist()
    assert list(out.token_ids) == ref
