"""Logprobs in OpenAI's two shapes: chat (``content[]``) and completions (parallel lists).

The engine gives, per generated token, ``{token_id: logprob}`` holding the sampled token plus the
top-k asked for. Token texts are single-token decodes; ``bytes`` are the token's exact UTF-8
bytes where the tokenizer is byte-level BPE (a token may hold part of a character).
"""

from __future__ import annotations

from typing import Any

from .protocol import ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable-character alphabet for the 256 byte values, inverted."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    keep += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_DECODER = _byte_level_decoder()


class TokenTexts:
    """Cached text and bytes of single tokens for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            raw = text.encode("utf-8")
            if isinstance(piece, str) and piece and all(c in _BYTE_DECODER for c in piece):
                exact = bytes(_BYTE_DECODER[c] for c in piece)
                # trust the byte-level reading only where it agrees with the decode
                if exact.decode("utf-8", errors="replace") == text:
                    raw = exact
            hit = (text, list(raw))
            self._cache[token_id] = hit
        return hit

    def text(self, token_id: int) -> str:
        return self.get(token_id)[0]


def _ranked(lps: dict[int, float], k: int) -> list[tuple[int, float]]:
    return sorted(lps.items(), key=lambda kv: kv[1], reverse=True)[:k]


def chat_logprobs(
    texts: TokenTexts, token_ids: list[int], logprobs: list[dict[int, float]], top: int
) -> ChatLogprobs:
    """``choices[].logprobs`` of a chat completion for ``token_ids`` (one dict per token)."""
    content = []
    for tid, lps in zip(token_ids, logprobs, strict=False):
        text, raw = texts.get(tid)
        tops = []
        for other, lp in _ranked(lps, top):
            t, b = texts.get(other)
            tops.append(TopLogprob(t, _finite(lp), b))
        content.append(TokenLogprob(text, _finite(lps.get(tid, float("-inf"))), raw, tops))
    return ChatLogprobs(content)


def completion_logprobs(
    texts: TokenTexts,
    token_ids: list[int],
    logprobs: list[dict[int, float] | None],
    top: int,
    offset: int = 0,
) -> CompletionLogprobs:
    """``choices[].logprobs`` of a completion; ``offset``: characters of text before these.

    ``logprobs[i]`` is None for a token without one (the first prompt token under ``echo``).
    """
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for tid, lps in zip(token_ids, logprobs, strict=False):
        text = texts.text(tid)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if lps is None:
            token_lps.append(None)
            tops.append(None)
            continue
        token_lps.append(_finite(lps.get(tid, float("-inf"))))
        top_map = {texts.text(o): _finite(lp) for o, lp in _ranked(lps, top)}
        top_map.setdefault(text, _finite(lps.get(tid, float("-inf"))))
        tops.append(top_map)
    return CompletionLogprobs(tokens, token_lps, tops, offsets)


def merge_completion_logprobs(parts: list[CompletionLogprobs]) -> CompletionLogprobs:
    out = CompletionLogprobs([], [], [], [])
    for p in parts:
        out.tokens += p.tokens
        out.token_logprobs += p.token_logprobs
        out.top_logprobs += p.top_logprobs
        out.text_offset += p.text_offset
    return out


def _finite(x: float) -> float:
    # JSON has no -inf; OpenAI clients expect a number. -9999.0 is what OpenAI itself sends.
    return max(float(x), -9999.0)
