"""Incremental detokenization: token ids in, clean text deltas out, stop strings cut.

Two layers:

* ``_TokenStream`` turns ids into text with a sliding window (vLLM's ``prefix_offset`` /
  ``read_offset``; the same algorithm as ``tokenizers.decoders.DecodeStream``, which it uses when
  the tokenizer has a Rust backend). The window is decoded as a whole so that SentencePiece's
  leading-space rules and byte-level BPE come out as in a full decode; text is held while it
  ends in U+FFFD (a multi-byte character split across tokens), so no delta ever carries half a
  character. Work per token is O(window), the window being the ids since the last delta but one.

      ids:  ... | prefix ids (decoded: prefix_text) | unread ids |
                  ^ window start                      ^ prefix_len
      delta = decode(window)[len(prefix_text):], once it does not end in U+FFFD

* ``IncrementalDetokenizer`` adds stop strings on top: text that could still become a stop
  string (a suffix equal to a stop string's proper prefix) is held back until decided; a found
  stop string cuts the text (kept when ``include_stop_str_in_output``) and sets ``stop_reason``.

Contract: the deltas of ``add()`` plus ``flush()`` concatenate to
``decode(ctx + output)[len(decode(ctx)):]``, ``ctx`` being the last few prompt ids (for byte-level
BPE, and with no prompt, simply ``decode(output)``), decoded without cleaning up spaces, and cut
at the first stop string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from edge_llm.sampling_params import SamplingParams

try:  # tokenizers >= 0.22 (DecodeStream with prompt prefill)
    from tokenizers import Tokenizer as _RustTokenizer
    from tokenizers.decoders import DecodeStream as _DecodeStream
except ImportError:  # pragma: no cover - older tokenizers: the Python window does the work
    _RustTokenizer = None
    _DecodeStream = None

_REPLACEMENT = "\ufffd"
# Prompt ids decoded with the output so the first output token gets its leading space right
# (vLLM and SGLang use the same five).
_CONTEXT_TOKENS = 5
# tokenizers raises a bare Exception with this message when a window's text stops extending
# the previous one (the prefix changed); we then carry on with the Python window.
_INVALID_PREFIX = "Invalid prefix encountered"


def _rust_backend(tokenizer: Any) -> Any | None:
    """The ``tokenizers.Tokenizer`` behind ``tokenizer`` (an HF fast tokenizer or itself)."""
    if _RustTokenizer is not None and isinstance(tokenizer, _RustTokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if _RustTokenizer is not None and isinstance(backend, _RustTokenizer):
        return backend
    return None


class _TokenStream:
    """Clean text deltas of a growing sequence of ids (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool,
        use_decode_stream: bool = True,
    ) -> None:
        backend = _rust_backend(tokenizer)
        self._decode: Callable[[list[int]], str]
        if backend is not None:
            self._decode = lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
        elif hasattr(tokenizer, "decode"):
            self._decode = lambda ids: tokenizer.decode(
                ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
            )
        else:
            raise TypeError(f"tokenizer must have a decode() method, got {type(tokenizer)!r}.")
        ctx = [int(t) for t in list(prompt_token_ids)[-_CONTEXT_TOKENS:]]
        if ctx and self._decode(ctx).endswith(_REPLACEMENT):
            ctx = []  # the prompt ends mid-character: its bytes cannot prefix clean output text
        self._ids = ctx  # the window: prefix ids, then unread ids
        self._prefix_len = len(ctx)
        self._prefix_text: str | None = None  # decode(ids[:prefix_len]), computed when needed
        self._backend = backend
        self._stream = None
        if backend is not None and use_decode_stream and _DecodeStream is not None:
            self._stream = _DecodeStream(ids=list(ctx), skip_special_tokens=skip_special_tokens)

    @property
    def uses_decode_stream(self) -> bool:
        return self._stream is not None

    def step(self, token_id: int) -> str:
        """Feed one id; return the text it completes ("" while a character is incomplete)."""
        self._ids.append(token_id)
        if self._stream is not None:
            try:
                piece = self._stream.step(self._backend, token_id)
            except Exception as exc:  # tokenizers raises a bare Exception
                if _INVALID_PREFIX not in str(exc):
                    raise
                self._stream = None  # its state is spoilt; our window holds the same ids
            else:
                if piece is None:
                    return ""
                self._advance()
                return piece
        prefix_text = self._prefix()
        text = self._decode(self._ids)
        if len(text) <= len(prefix_text) or text.endswith(_REPLACEMENT):
            return ""
        self._advance()
        return text[len(prefix_text) :]

    def flush(self) -> str:
        """Text of the ids still held (an incomplete character decodes as U+FFFD, as in a full
        decode); afterwards the stream is empty."""
        if len(self._ids) == self._prefix_len:
            return ""
        prefix_text = self._prefix()
        text = self._decode(self._ids)
        if text.startswith(prefix_text):
            piece = text[len(prefix_text) :]
        else:
            piece = self._decode(self._ids[self._prefix_len :])
        self._advance()
        self._stream = None  # its window now lags ours; later steps use the Python window
        return piece

    def _prefix(self) -> str:
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._ids[: self._prefix_len])
        return self._prefix_text

    def _advance(self) -> None:
        """The unread ids were turned into text: they become the next prefix."""
        del self._ids[: self._prefix_len]
        self._prefix_len = len(self._ids)
        self._prefix_text = None


def _first_stop(text: str, stops: Sequence[str], min_end: int) -> tuple[int, str] | None:
    """(start, stop string) of the stop occurrence in ``text`` that ends first, among those
    ending after ``min_end``; ties go to the one starting first. None when there is none.

    Ending first is what a token-by-token reader sees first, so the cut does not depend on how
    the text was split into deltas.
    """
    best: tuple[int, int, str] | None = None
    for stop in stops:
        pos = text.find(stop, max(0, min_end - len(stop) + 1))
        if pos >= 0 and (best is None or (pos + len(stop), pos) < best[:2]):
            best = (pos + len(stop), pos, stop)
    return None if best is None else (best[1], best[2])


def _stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    keep = 0
    for stop in stops:
        if not text or text[-1] not in stop[:-1]:
            continue  # any such suffix ends with a character of stop[:-1]
        for cut in range(min(len(stop) - 1, len(text)), keep, -1):
            if text.endswith(stop[:cut]):
                keep = cut
                break
    return keep


class IncrementalDetokenizer:
    """Per-sequence streaming detokenizer with stop strings.

    ``add(ids)`` returns the text that may be shown now; ``flush()`` (when the sequence ends for
    another reason: length, EOS, abort) returns what was held back. Once a stop string is found
    ``finished`` is True, ``stop_reason`` is that string, ``text`` is cut, and ``add`` raises.
    Stop strings only count when they end in text of output token ``min_tokens + 1`` or later
    (vLLM's rule). ``text`` includes held-back text; after ``flush()`` it equals the deltas.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: Sequence[int] | None,
        params: SamplingParams,
        *,
        use_decode_stream: bool = True,
    ) -> None:
        self._stream = _TokenStream(
            tokenizer, prompt_token_ids or [], params.skip_special_tokens, use_decode_stream
        )
        self._stops: list[str] = list(params.stop or [])
        self._include_stop = params.include_stop_str_in_output
        self._min_tokens = params.min_tokens
        self._pieces: list[str] = []  # emitted text
        self._num_emitted = 0  # characters emitted
        self._held = ""  # decoded, not emitted: a possible stop-string prefix
        self._num_tokens = 0
        # absolute character offset a stop string must end after; None within min_tokens
        self._stop_floor: int | None = 0 if self._min_tokens == 0 else None
        self._flushed = False
        self.stop_reason: str | None = None

    @property
    def finished(self) -> bool:
        """True once a stop string was found."""
        return self.stop_reason is not None

    @property
    def uses_decode_stream(self) -> bool:
        return self._stream.uses_decode_stream

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def text(self) -> str:
        """The output text so far (held-back text included), cut at a found stop string."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return (self._pieces[0] if self._pieces else "") + self._held

    def add(self, token_ids: Sequence[int], stop_terminated: bool = False) -> str:
        """Feed newly sampled ids; return the text delta that may be emitted now.

        ``stop_terminated``: the last id ended the sequence as an EOS / stop token id; as in
        vLLM its text is left out unless ``include_stop_str_in_output``.
        """
        if self.finished or self._flushed:
            raise RuntimeError("IncrementalDetokenizer.add() after the sequence finished.")
        new: list[str] = []
        total = self._num_emitted + len(self._held)
        drop_last = stop_terminated and not self._include_stop and len(token_ids) > 0
        for n, token_id in enumerate(token_ids):
            if drop_last and n == len(token_ids) - 1:
                self._num_tokens += 1
                break
            piece = self._stream.step(int(token_id))
            new.append(piece)
            total += len(piece)
            self._num_tokens += 1
            if self._num_tokens == self._min_tokens:
                self._stop_floor = total
        return self._release("".join(new), final=False)

    def flush(self) -> str:
        """The held-back text (an incomplete stop-string prefix, an incomplete character), once
        the sequence ends without a stop string. Returns "" after a stop string."""
        if self.finished or self._flushed:
            return ""
        self._flushed = True
        return self._release(self._stream.flush(), final=True)

    def _release(self, new: str, final: bool) -> str:
        pending = self._held + new  # starts at absolute offset self._num_emitted
        self._held = ""
        if self._stops and self._stop_floor is not None:
            hit = _first_stop(pending, self._stops, self._stop_floor - self._num_emitted)
            if hit is not None:
                start, stop = hit
                self.stop_reason = stop
                return self._emit(pending[: start + len(stop) if self._include_stop else start])
        keep = 0 if final or not self._stops else _stop_prefix_len(pending, self._stops)
        if keep:
            self._held = pending[-keep:]
            pending = pending[:-keep]
        return self._emit(pending)

    def _emit(self, delta: str) -> str:
        if delta:
            self._pieces.append(delta)
            self._num_emitted += len(delta)
        return delta
