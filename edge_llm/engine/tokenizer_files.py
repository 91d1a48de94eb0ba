"""A tokenizer folder read as transformers 5 reads it, without importing transformers.

``read_tokenizer_dir(path)`` returns the parts ``FastTokenizer`` is built from: the
``tokenizers.Tokenizer`` (truncation and padding off, added tokens re-added),
tokenizer_config.json, the named and extra special tokens and the chat template(s). For a folder
whose tokenizer transformers itself would load as a plain ``TokenizersBackend``
(``tokenizer_class`` "TokenizersBackend" or "PreTrainedTokenizerFast"), the result is
``tokenizer.json`` plus the special tokens of ``tokenizer_config.json``, which this module
reproduces step by step (``TokenizersBackend.__init__`` and
``PreTrainedTokenizerBase._from_pretrained``, read at transformers 5.17 and 5.24, which agree
here):

* ``tokenizer.json`` as is; truncation and padding off (transformers turns them off for every
  plain ``encode``); a padding section still names the pad token when the config does not;
* ``add_bos_token`` / ``add_eos_token`` of the config are ignored beside a ``tokenizer.json``
  (transformers drops them too: the file's post-processor decides);
* added tokens: the config's ``added_tokens_decoder`` (else the file's ``added_tokens``, with
  ``special_tokens_map.json`` naming the special tokens) re-added in id order, then every named
  or extra special token not yet present, as special;
* ``split_special_tokens``, ``clean_up_tokenization_spaces`` (never applied to BPE models): left
  in the config, which ``FastTokenizer`` reads;
* the chat template: ``chat_template.jinja`` and ``additional_chat_templates/*.jinja`` over the
  config's ``chat_template`` (a string or a list of named templates).

``fast_path_refusal()`` says why a folder must go to transformers instead (no tokenizer.json,
remote code, a model-specific tokenizer class that rebuilds the pipeline, ...);
``read_tokenizer_dir`` raises ValueError for such a folder and for a config entry it cannot
read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from edge_llm.model.arch import read_json_object

# transformers' TokenizersBackend.SPECIAL_TOKENS_ATTRIBUTES
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")
# tokenizer_class values transformers loads as a plain TokenizersBackend over tokenizer.json
PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# model types for which transformers may not build a plain TokenizersBackend: its
# MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS (the union of 5.17's and 5.24's: the registered class
# wins over the declared one) and the types that use MistralCommonBackend where mistral-common
# is installed
OVERRIDDEN_MODEL_TYPES = frozenset({
    "arctic", "camembertv2-base", "chameleon", "chatlm", "cohere_asr", "deepseek_ocr",
    "deepseek_ocr2", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "deepseek_vl",
    "deepseek_vl_hybrid", "deepseek_vl_v2", "ernie4_5", "ernie4_5_moe", "fuyu", "h2ovl_chat",
    "hyperclovax", "hyperclovax_vision_v2", "hyperclovax_vlm", "internlm2", "internlm3",
    "iquestcoder", "jamba", "janus", "llava", "llava_next", "minicpm3", "minicpmv", "minimax_m2",
    "modernbert", "modernbert-decoder", "molmo", "molmo2", "nemotron", "nvfp4", "opencua",
    "openvla", "paddleocr_vl", "phi3", "phi3_v", "phimoe", "qwen2", "qwen3_5", "qwen3_5_moe",
    "qwen3_5_moe_text", "qwen4_exp", "siglip2", "step3_vl", "step3p5", "vipllava",
    "vision-encoder-decoder",
    # MistralCommonBackend
    "ministral", "ministral3", "mistral", "mistral3", "mistral_large4", "mixtral", "pixtral",
    "voxtral", "voxtral_realtime",
})


# one of these makes a folder loadable by tokenizers or transformers (the slow tokenizers'
# vocabularies included); a folder with none fails only deep inside transformers
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tekken.json", "vocab.json",
                   "spiece.model", "vocab.txt", "sentencepiece.bpe.model")


def check_tokenizer_files(path: Path) -> None:
    """ValueError naming the folder when it holds no tokenizer file (checked before the
    weights load, so a folder without one is refused in a second, not after the load)."""
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"{path}: no tokenizer files: expected one of "
                         f"{', '.join(TOKENIZER_FILES)} beside config.json.")


def _read_json(path: Path) -> dict:
    """``path``'s JSON object, {} when there is no such file (ValueError naming it else)."""
    return read_json_object(path) if path.is_file() else {}


def fast_path_refusal(path: Path) -> str | None:
    """None when ``path`` can be loaded by ``FastTokenizer`` with transformers' exact result;
    otherwise the reason it cannot (the caller falls back to ``AutoTokenizer``)."""
    if not (path / "tokenizer.json").is_file():
        return "no tokenizer.json"
    if (path / "tekken.json").is_file():
        return "tekken.json (Mistral's own tokenizer format)"
    tok_cfg = _read_json(path / "tokenizer_config.json")
    model_cfg = _read_json(path / "config.json")
    if "auto_map" in tok_cfg:
        return "tokenizer_config.json has an auto_map (remote code)"
    if "fast_tokenizer_files" in tok_cfg:
        return "tokenizer_config.json lists fast_tokenizer_files"
    cls = tok_cfg.get("tokenizer_class") or model_cfg.get("tokenizer_class")
    if cls not in PLAIN_CLASSES:
        return f"tokenizer_class {cls!r}: transformers builds that class's own pipeline"
    for key in ("model_type", "model_name"):
        if model_cfg.get(key) in OVERRIDDEN_MODEL_TYPES:
            return f"{key} {model_cfg[key]!r}: transformers picks its registered tokenizer class"
    return None


def _added_token(value: Any, special: bool | None = None) -> Any:
    """A ``tokenizers.AddedToken`` from a config entry (a string or a dict of its fields)."""
    from tokenizers import AddedToken

    if isinstance(value, AddedToken):
        return value
    if isinstance(value, str):
        return AddedToken(value, special=True if special is None else special)
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        fields = {k: v for k, v in value.items() if k != "__type"}
        if special is not None:
            fields["special"] = special
        return AddedToken(**fields)
    raise ValueError(f"Cannot read a token from {value!r}.")


def _token_setting(value: Any) -> Any:
    """A special-token setting of tokenizer_config.json: a string, an AddedToken or None."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and value.get("__type") == "AddedToken":
        return _added_token(value)
    raise ValueError(f"Unsupported special-token setting {value!r}.")


def _chat_templates(path: Path, configured: Any) -> str | dict[str, str] | None:
    """The chat template(s): files next to the tokenizer override tokenizer_config.json's."""
    found: dict[str, str] = {}
    default = path / "chat_template.jinja"
    if default.is_file():
        found["default"] = default.read_text(encoding="utf-8")
    extra_dir = path / "additional_chat_templates"
    if extra_dir.is_dir():
        for file in sorted(extra_dir.glob("*.jinja")):
            found[file.name.removesuffix(".jinja")] = file.read_text(encoding="utf-8")
    if len(found) == 1 and "default" in found:
        return found["default"]
    if found:
        return found
    if isinstance(configured, (list, tuple)):
        return {t["name"]: t["template"] for t in configured}
    return configured


def _special_settings(config: dict) -> tuple[dict[str, Any], list[Any]]:
    """Named special tokens (the standard names, then model-specific ``*_token`` keys: those
    written as AddedToken dicts first, as transformers orders them, then strings, then an
    ``extra_special_tokens`` dict) and the list of extra special tokens."""
    special = {name: _token_setting(config.get(name)) for name in SPECIAL_TOKEN_NAMES}
    own = [k for k in config if k.endswith("_token") and k not in special]
    for key in own:
        if isinstance(config[key], Mapping) and config[key].get("__type") == "AddedToken":
            special[key] = _token_setting(config[key])
    for key in own:
        if isinstance(config[key], str):
            special[key] = config[key]
    extra = config.get("extra_special_tokens") or []
    if isinstance(extra, Mapping):
        special.update({k: _token_setting(v) for k, v in extra.items()})
        extra = []
    return special, [_token_setting(t) if isinstance(t, Mapping) else t for t in extra]


def _apply_special_tokens_map(stm: dict, config: dict, special: dict[str, Any],
                              extra: list[Any]) -> None:
    """special_tokens_map.json's entries over the config's (transformers reads the file only
    when the config has no ``added_tokens_decoder``)."""
    for key, value in stm.items():
        if key == "extra_special_tokens" and isinstance(value, list):
            for tok in value:
                tok = _added_token({**tok, "special": True}) if isinstance(tok, Mapping) else tok
                if tok not in extra:
                    extra.append(tok)
        elif key == "additional_special_tokens" and isinstance(value, list):
            if "extra_special_tokens" not in config:
                extra[:] = [_added_token({**t, "special": True}) if isinstance(t, Mapping) else t
                            for t in value]
        elif key.endswith("_token"):
            special[key] = (_added_token({**value, "special": True})
                            if isinstance(value, Mapping) else value)


def _add_tokens(backend: Any, configured: list[Any], special: dict[str, Any],
                extra: list[Any]) -> None:
    """Re-add the configured added tokens (id order; this updates their flags in the backend),
    then every named or extra special token not present yet; named ones are marked special."""
    to_add = list(configured)
    present = {str(t) for t in backend.get_added_tokens_decoder().values()}
    present.update(str(t) for t in to_add)
    for value in [*special.values(), *extra]:
        if value is not None and str(value) not in present and value not in to_add:
            to_add.append(value)
    named = {str(v) for v in special.values() if v}
    tokens = []
    for token in to_add:
        token = _added_token(token)
        if not token.special and str(token) in named:
            token.special = True
        tokens.append(token)
    if tokens:
        backend.add_tokens(tokens)


class TokenizerParts(NamedTuple):
    """What ``FastTokenizer.__init__`` takes, in its argument order, read from one folder."""

    backend: Any  # tokenizers.Tokenizer: truncation and padding off, added tokens re-added
    config: dict[str, Any]  # tokenizer_config.json (extra special tokens under one key)
    special_tokens: dict[str, Any]  # name -> str, AddedToken or None
    extra_special_tokens: list[Any]
    chat_template: str | dict[str, str] | None


def read_tokenizer_dir(path: Path) -> TokenizerParts:
    """The parts of the tokenizer in ``path`` (a folder ``fast_path_refusal`` accepts;
    ValueError otherwise)."""
    from tokenizers import Tokenizer, processors

    reason = fast_path_refusal(path)
    if reason is not None:
        raise ValueError(f"{path}: not loadable without transformers: {reason}.")
    config = _read_json(path / "tokenizer_config.json")
    backend = Tokenizer.from_file(str(path / "tokenizer.json"))
    padding = backend.padding
    backend.no_truncation()
    backend.no_padding()
    if "additional_special_tokens" in config and not config.get("extra_special_tokens"):
        config["extra_special_tokens"] = config.pop("additional_special_tokens")
    special, extra = _special_settings(config)
    if "added_tokens_decoder" in config:
        by_id = {int(i): _added_token(t) for i, t in config["added_tokens_decoder"].items()}
        has_pad = "pad_token" in config
    else:  # the file's added tokens; special_tokens_map.json names the special ones
        stm = _read_json(path / "special_tokens_map.json")
        _apply_special_tokens_map(stm, config, special, extra)
        # the file's added_tokens, as loaded (parsing the JSON again costs ~50 ms)
        by_id = dict(backend.get_added_tokens_decoder())
        has_pad = "pad_token" in config or "pad_token" in stm
    by_text = {str(t): t for t in by_id.values()}
    for key in SPECIAL_TOKEN_NAMES:  # a named token that is an added token takes its flags
        if special.get(key) is not None:
            special[key] = by_text.get(str(special[key]), special[key])
    if padding is not None and not has_pad:
        special["pad_token"] = padding["pad_token"]
    _add_tokens(backend, [by_id[i] for i in sorted(by_id)], special, extra)
    if backend.post_processor is None:  # transformers installs this (adds nothing to one text)
        backend.post_processor = processors.TemplateProcessing(
            single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    template = _chat_templates(path, config.get("chat_template"))
    return TokenizerParts(backend, config, special, extra, template)
