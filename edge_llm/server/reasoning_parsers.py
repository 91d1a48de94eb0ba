"""``<think>...</think>`` reasoning split from the reply, incrementally (``feed`` each text
delta, then ``finish``), as vLLM's reasoning parsers do.

* ``deepseek_r1``: the reply starts in reasoning (DeepSeek-R1 distills' templates open
  ``<think>`` in the prompt); everything before ``</think>`` is reasoning, a leading
  ``<think>`` is dropped; a reply that never closes it is all reasoning.
* ``qwen3``: reasoning only when the reply opens with ``<think>`` or the rendered prompt ends
  with it (Qwen3 and thinking fine-tunes); otherwise the reply is content.

``auto`` (the server's default) picks ``qwen3`` when the chat template mentions ``</think>``.
"""

from __future__ import annotations

from .tool_parsers import held_prefix

PARSERS = ("deepseek_r1", "qwen3")
OPEN, CLOSE = "<think>", "</think>"


class ReasoningParser:
    def __init__(self, kind: str, prompt_text: str | None = None) -> None:
        if kind not in PARSERS:
            raise ValueError(f"reasoning parser must be one of {PARSERS}, got {kind!r}.")
        opened_in_prompt = bool(prompt_text) and prompt_text.rstrip().endswith(OPEN)
        self.state = "reasoning" if kind == "deepseek_r1" or opened_in_prompt else "start"
        self.buf = ""
        self.opened = False  # the leading <think>, if any, was seen (or ruled out)

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of this delta; partial tags are held back."""
        self.buf += text
        reasoning = content = ""
        if self.state == "start":
            head = self.buf.lstrip()
            if not head or (len(head) < len(OPEN) and OPEN.startswith(head)):
                return "", ""
            if head.startswith(OPEN):
                self.state, self.buf, self.opened = "reasoning", head[len(OPEN):], True
            else:
                self.state = "content"
        if self.state == "reasoning":
            if not self.opened:  # deepseek_r1 replies may still open with <think>
                head = self.buf.lstrip()
                if len(head) < len(OPEN) and OPEN.startswith(head):
                    return "", ""
                self.opened = True
                if head.startswith(OPEN):
                    self.buf = head[len(OPEN):]
            end = self.buf.find(CLOSE)
            if end < 0:
                keep = len(self.buf) - held_prefix(self.buf, CLOSE)
                reasoning, self.buf = self.buf[:keep], self.buf[keep:]
                return reasoning, ""
            reasoning = self.buf[:end]
            self.buf = self.buf[end + len(CLOSE):]
            self.state = "after"
        if self.state == "after":  # the newlines after </think> belong to neither
            self.buf = self.buf.lstrip("\n")
            if not self.buf:
                return reasoning, ""
            self.state = "content"
        if self.state == "content":
            content, self.buf = self.buf, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What was held back; a reply's last call."""
        rest = self.buf
        if self.state == "reasoning":
            return rest, ""
        return "", rest  # "after" holds nothing: feed drops those newlines as they come


def parser_of_template(template: str | None) -> str | None:
    return "qwen3" if template and CLOSE in template else None
