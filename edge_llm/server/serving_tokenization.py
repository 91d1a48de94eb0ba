"""vLLM's tokenizer routes: ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``.

Same request and response shapes as vLLM (``vllm/entrypoints/openai/protocol.py``):
``/tokenize`` takes a completions-style body (``prompt``; special tokens added by default) or
a chat-style one (``messages`` rendered with the served chat template, generation prompt
added, no further special tokens by default) and answers ``count``, ``max_model_len``,
``tokens`` and, with ``return_token_strs``, ``token_strs``. ``/detokenize`` turns ``tokens``
back into ``prompt``. ``/tokenizer_info`` is the tokenizer's configuration with its special
tokens and effective chat template (lm-eval's remote tokenizer reads ``eos_token``,
``bos_token`` and ``chat_template`` from it). The prompt and the chat template are the ones the
completions and chat routes use, so counts match what generation sees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from msgspec import Struct

from .engine_api import ServingEngine
from .errors import bad_request
from .preprocess import messages_to_dicts, render_chat, tokenize_text
from .protocol import ChatMessage, Int64

_RESERVED_TEMPLATE_KWARGS = ("add_generation_prompt", "continue_final_message", "chat_template",
                             "messages", "tokenize")


class TokenizeRequest(Struct, kw_only=True):
    """vLLM's ``TokenizeCompletionRequest`` and ``TokenizeChatRequest`` in one body: exactly
    one of ``prompt`` and ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # None: True for a prompt, False for messages
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    return_token_strs: bool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


class TokenizeResponse(Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(Struct, kw_only=True):
    tokens: list[Int64]
    model: str | None = None


class DetokenizeResponse(Struct):
    prompt: str


def tokenize(req: TokenizeRequest, engine: ServingEngine, template: str | None) -> TokenizeResponse:
    """Token ids of the request's prompt or rendered messages; 400 naming the field on bad
    input. ``template``: the server's ``--chat-template`` text (None: the tokenizer's)."""
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("Send either 'prompt' (text) or 'messages' (a chat), not both or "
                          "neither.", "prompt" if req.prompt is not None else "messages")
    tokenizer = engine.tokenizer
    if req.prompt is not None:
        add = True if req.add_special_tokens is None else req.add_special_tokens
        ids = tokenize_text(tokenizer, req.prompt, add)
    else:
        text = _render(req, engine, template)
        ids = tokenize_text(tokenizer, text, bool(req.add_special_tokens))
    strs = list(tokenizer.convert_ids_to_tokens(ids)) if req.return_token_strs else None
    return TokenizeResponse(len(ids), engine.max_model_len, ids, strs)


def _render(req: TokenizeRequest, engine: ServingEngine, template: str | None) -> str:
    if req.chat_template is not None:
        raise bad_request("A per-request chat_template is not accepted: start the server with "
                          "--chat-template instead.", "chat_template")
    continue_final = bool(req.continue_final_message)
    add_generation_prompt = req.add_generation_prompt is not False
    if continue_final and add_generation_prompt:
        raise bad_request("continue_final_message and add_generation_prompt cannot both be "
                          "true: set add_generation_prompt to false to continue the final "
                          "message.", "continue_final_message")
    extra: dict[str, Any] = dict(req.chat_template_kwargs or {})
    for name in _RESERVED_TEMPLATE_KWARGS:
        if name in extra:
            raise bad_request(f"chat_template_kwargs must not set {name!r}.",
                              "chat_template_kwargs")
    if continue_final:
        extra["continue_final_message"] = True
    if req.tools:
        extra["tools"] = req.tools
    messages = messages_to_dicts(req.messages or [])
    return render_chat(engine, messages, template, add_generation_prompt, **extra)


def detokenize(req: DetokenizeRequest, engine: ServingEngine) -> DetokenizeResponse:
    """The text of ``tokens`` (special tokens kept, as vLLM does); 400 for an id outside the
    vocabulary."""
    vocab = len(engine.tokenizer)
    for i, t in enumerate(req.tokens):
        if not 0 <= t < vocab:
            raise bad_request(f"tokens[{i}] is {t}, outside the vocabulary [0, {vocab}).",
                              "tokens")
    return DetokenizeResponse(engine.tokenizer.decode(req.tokens))


def tokenizer_info(engine: ServingEngine, template: str | None) -> dict[str, Any]:
    """The tokenizer's configuration (its ``tokenizer_config.json`` less the added-token table)
    with its special tokens as strings, ``tokenizer_class``, ``model_max_length`` (the served
    context) and the chat template the chat route uses."""
    tokenizer = engine.tokenizer
    info: dict[str, Any] = {}
    folder = engine.model_path
    config_file = Path(folder) / "tokenizer_config.json" if folder is not None else None
    if config_file is not None and config_file.is_file():
        try:
            raw = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = {}
        if isinstance(raw, dict):
            info.update({k: _plain(v) for k, v in raw.items() if k != "added_tokens_decoder"})
    info.update(getattr(tokenizer, "special_tokens_map", None) or {})
    info.setdefault("tokenizer_class", type(tokenizer).__name__)
    info["name_or_path"] = str(getattr(tokenizer, "name_or_path", "") or folder or "")
    info["model_max_length"] = engine.max_model_len
    chat_template = template or getattr(tokenizer, "chat_template", None)
    if chat_template:
        info["chat_template"] = chat_template
    else:
        info.pop("chat_template", None)
    return info


def _plain(value: Any) -> Any:
    """An AddedToken-like dict ({"content": ..., "__type": "AddedToken"}) as its text."""
    if isinstance(value, dict) and "content" in value and value.get("__type") == "AddedToken":
        return value["content"]
    return value
