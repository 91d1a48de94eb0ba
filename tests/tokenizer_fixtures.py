"""Tokenizer folders for the fast-tokenizer tests, written with the tokenizers library only.

Each one stresses a part of transformers' loading rules: added-token flags rewritten by the
config, special tokens that are not in the vocabulary, special_tokens_map.json, padding and
truncation saved in tokenizer.json, split_special_tokens, clean-up of spaces on a non-BPE model,
named chat templates. No test here; the builders return the folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# A template using what the transformers environment offers: namespace, loop controls,
# tojson with options, dict(), raise_exception, the generation tag, special-token variables,
# tools and an extra variable.
RICH_TEMPLATE = """
{%- set ns = namespace(sys=none, n=0) -%}
{%- if messages[0]['role'] == 'system' %}{% set ns.sys = messages[0]['content'] %}{% endif -%}
{{ bos_token }}
{%- if tools %}
<tools>{{ tools | tojson }}</tools>
{%- for t in tools %}{{ t['function']['name'] | tojson(indent=2) }}{% endfor %}
{%- endif %}
{% for m in messages %}
  {%- if m['role'] == 'system' %}{% continue %}{% endif %}
  {%- if m['role'] not in ['user', 'assistant'] -%}
    {{ raise_exception('bad role ' + m['role']) }}
  {%- endif %}
  {%- set ns.n = ns.n + 1 %}
<|{{ m['role'] }}|> {{ ns.n }}
  {% if m['role'] == 'assistant' %}
    {%- generation %}{{ m['content'] | trim }}{{ eos_token }}{% endgeneration %}
  {%- else %}{{ m['content'] }}{% endif %}
  {%- if loop.index > 50 %}{% break %}{% endif %}
{% endfor %}
{%- if ns.sys %}[sys: {{ ns.sys }}]{% endif %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}
{{- dict(a=1, b=['é', 2]) | tojson }}{{ extra_var | default('') }}
"""

TOOL_TEMPLATE = "{% for t in tools %}[{{ t['function']['name'] }}]{% endfor %}" \
                "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def _calibration_text() -> str:
    return (Path(__file__).resolve().parents[1] / "edge_llm" / "data" / "calibration.txt"
            ).read_text(encoding="utf-8")


def _write(out: Path, tokenizer_json: dict, tok_config: dict, **files: object) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, ensure_ascii=False))
    for name, data in files.items():
        (out / f"{name}.json").write_text(json.dumps(data))
    return out


def _entry(i: int, content: str, special: bool, **flags: bool) -> dict:
    return {"id": i, "content": content, "single_word": flags.get("single_word", False),
            "lstrip": flags.get("lstrip", False), "rstrip": flags.get("rstrip", False),
            "normalized": flags.get("normalized", not special), "special": special}


def metaspace_bpe_dir(out: Path) -> Path:
    """A SentencePiece-style BPE (Metaspace, BOS added by the post-processor) trained on the
    calibration text; the config rewrites added-token flags, declares a model-specific token,
    an extra special token, named chat templates and settings transformers ignores here."""
    from tokenizers import SentencePieceBPETokenizer, processors

    spm = SentencePieceBPETokenizer()
    spm.train_from_iterator([_calibration_text()], vocab_size=400,
                            special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok = spm._tokenizer
    tok.add_tokens(["<tool>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    data = json.loads(tok.to_str())
    added = {str(t["id"]): {k: v for k, v in t.items() if k != "id"}
             for t in data["added_tokens"]}
    tool_id = str(data["added_tokens"][-1]["id"])
    added[tool_id].update(rstrip=True, lstrip=True)  # the config's flags win over the file's
    added["2"]["special"] = False  # a named token: transformers marks it special again
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "image_token": "<image>", "extra_special_tokens": ["<extra_0>"],
        "clean_up_tokenization_spaces": True,  # BPE: transformers skips the clean-up anyway
        "add_bos_token": False,  # ignored beside tokenizer.json: the post-processor adds BOS
        "added_tokens_decoder": added,
        "chat_template": [{"name": "default", "template": RICH_TEMPLATE},
                          {"name": "tool_use", "template": TOOL_TEMPLATE}],
    }
    return _write(out, data, config, config={"model_type": "llama"})


def special_map_dir(demo: Path, out: Path) -> Path:
    """The demo tokenizer with no added_tokens_decoder: special_tokens_map.json names the
    special tokens (a dict entry, a token new to the vocabulary, additional tokens)."""
    data = json.loads((demo / "tokenizer.json").read_text(encoding="utf-8"))
    config = {"tokenizer_class": "TokenizersBackend", "bos_token": "<|im_start|>",
              "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>"}
    stm = {"bos_token": {"content": "<|im_start|>", "lstrip": False, "normalized": False,
                         "rstrip": True, "single_word": False},
           "eos_token": "<|im_end|>", "pad_token": "<pad>",
           "additional_special_tokens": ["<|im_sep|>", "<repo_name>"]}
    out = _write(out, data, config, special_tokens_map=stm)
    shutil.copy(demo / "chat_template.jinja", out / "chat_template.jinja")
    (out / "additional_chat_templates").mkdir()
    (out / "additional_chat_templates" / "tool_use.jinja").write_text(TOOL_TEMPLATE)
    return out


WORDS = ["hello", "world", ".", ",", "!", "?", "n't", "'s", "'m", "do", "it", "is", "a", "b",
         "'", "don", "café", "日本", "x"]


def word_level_dir(out: Path) -> Path:
    """A word-level model (no decoder: ids decode joined by spaces) whose config asks for
    the clean-up of spaces and split_special_tokens; tokenizer.json saves padding and
    truncation (transformers turns both off for encode; the padding names the pad token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "[BOS]", "[EOS]", "[PAD]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["[UNK]", "[BOS]", "[EOS]"])
    tok.enable_padding(pad_id=3, pad_token="[PAD]", length=12)
    tok.enable_truncation(max_length=6)
    config = {"tokenizer_class": "TokenizersBackend", "bos_token": "[BOS]",
              "eos_token": "[EOS]", "unk_token": "[UNK]", "mask_token": "[MASK]",
              "clean_up_tokenization_spaces": True, "split_special_tokens": True}
    return _write(out, json.loads(tok.to_str()), config)
