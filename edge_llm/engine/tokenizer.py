"""Tokenizer and chat template loading (transformers' AutoTokenizer on the model folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer(path: Path, chat_template: str | None = None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if chat_template:
        file = Path(chat_template).expanduser()
        tok.chat_template = file.read_text() if file.is_file() else chat_template
    return tok


def apply_chat_template(
    tokenizer, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs
) -> str:
    """Render messages to the prompt text; a model without a template gets a clear error."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "This model's tokenizer has no chat template; pass one with --chat-template FILE "
            "or use the completions endpoint."
        )
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )


def eos_token_ids(tokenizer, arch_eos: tuple[int, ...], generation_config: dict) -> set[int]:
    ids = set(arch_eos)
    gen = generation_config.get("eos_token_id")
    if isinstance(gen, int):
        ids.add(gen)
    elif isinstance(gen, list):
        ids.update(int(x) for x in gen)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
