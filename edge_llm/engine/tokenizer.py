"""Tokenizer and chat template loading.

``load_tokenizer`` uses ``FastTokenizer`` (the Rust ``tokenizers`` library and jinja2, no
transformers import: seconds off a cold start) wherever transformers would load the folder as a
plain ``tokenizer.json``, and transformers' ``AutoTokenizer`` otherwise; the log line says which
and why.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from .fast_tokenizer import FastTokenizer, fast_path_refusal

logger = logging.getLogger(__name__)


def load_tokenizer(path: Path, chat_template: str | None = None, *,
                   trust_remote_code: bool = False, use_fast_path: bool = True) -> Any:
    """The tokenizer of the model folder ``path``; ``chat_template`` (a file or an inline
    template) replaces its own. ``use_fast_path=False`` forces transformers."""
    start = time.perf_counter()
    path = Path(path)
    reason = "disabled" if not use_fast_path else (
        "trust_remote_code" if trust_remote_code else fast_path_refusal(path))
    tok: Any = None
    if reason is None:
        try:
            tok = FastTokenizer.from_dir(path)
        except (ValueError, TypeError, KeyError) as exc:  # an unusual config: transformers reads it
            reason = f"{type(exc).__name__}: {exc}"
    if tok is None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    if chat_template:
        file = Path(chat_template).expanduser()
        tok.chat_template = file.read_text() if file.is_file() else chat_template
    how = "tokenizers" if reason is None else f"transformers ({reason})"
    logger.info("tokenizer loaded with %s in %.2f s", how, time.perf_counter() - start)
    return tok


def apply_chat_template(
    tokenizer, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs
) -> str:
    """Render messages to the prompt text; a model without a template gets a clear error.
    ``kwargs``: ``chat_template`` (overrides the tokenizer's), ``tools``,
    ``continue_final_message`` and template variables."""
    if not getattr(tokenizer, "chat_template", None) and not kwargs.get("chat_template"):
        raise ValueError(
            "This model's tokenizer has no chat template; pass one with --chat-template FILE "
            "or use the completions endpoint."
        )
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )


# Turn-ending special tokens of chat formats (Gemma, Phi-3, ChatML as in Phi-4 and Qwen, Llama
# 3). A chat model's generation_config.json lists its own among the EOS ids, but many 4-bit
# re-uploads ship without that file; llama.cpp ends generation on these too.
END_OF_TURN_TOKENS = ("<end_of_turn>", "<|end|>", "<|im_end|>", "<|eot_id|>")


def end_of_turn_ids(tokenizer) -> set[int]:
    """The ids of ``END_OF_TURN_TOKENS`` that are special tokens of ``tokenizer`` and appear
    in its chat template (so a base model's completions are not cut by them)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates
        template = "\n".join(str(t) for t in template.values())
    if not template:
        return set()
    added = getattr(tokenizer, "added_tokens_encoder", None) or {}
    return {int(added[t]) for t in END_OF_TURN_TOKENS if t in added and t in template}


def eos_token_ids(tokenizer, arch_eos: tuple[int, ...], generation_config: dict) -> set[int]:
    """What ends a sequence unless ``ignore_eos``: config.json's and generation_config.json's
    EOS ids, the tokenizer's EOS and the chat template's turn-ending token
    (``end_of_turn_ids``)."""
    ids = set(arch_eos) | end_of_turn_ids(tokenizer)
    gen = generation_config.get("eos_token_id")
    if isinstance(gen, int):
        ids.add(gen)
    elif isinstance(gen, list):
        ids.update(int(x) for x in gen)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
