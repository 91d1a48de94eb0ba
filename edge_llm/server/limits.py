"""What one request may ask for, checked on the decoded body before any tokenizing, and the
number of sequences it adds (its admission count).

Tokenizing and rendering a chat template cost CPU in proportion to the text: a request is
refused (400, naming the field and the flag) when it holds more prompts, messages or prompt
characters than the server allows, before that work starts.
"""

from __future__ import annotations

from edge_llm.config import ServerConfig

from .errors import bad_request
from .protocol import ChatCompletionRequest, CompletionRequest


def num_prompts(prompt: object) -> int:
    """Prompts in a completions ``prompt``: a string or one token-id list is one prompt."""
    if isinstance(prompt, list) and prompt and not all(isinstance(p, int) for p in prompt):
        return len(prompt)
    return 1


def chat_sequences(req: ChatCompletionRequest) -> int:
    return max(req.n or 1, 1)


def completion_sequences(req: CompletionRequest) -> int:
    return num_prompts(req.prompt) * max(req.n or 1, 1)


def _too_long(chars: int, limit: int, param: str) -> None:
    if chars > limit:
        raise bad_request(f"The prompt text holds {chars} characters; this server takes at "
                          f"most {limit} per request (--max-prompt-chars).", param)


def check_chat_limits(req: ChatCompletionRequest, config: ServerConfig) -> None:
    limit = config.max_messages
    if limit is not None and len(req.messages) > limit:
        raise bad_request(f"The request holds {len(req.messages)} messages; this server takes "
                          f"at most {limit} (--max-messages).", "messages")
    limit = config.max_prompt_chars
    if limit is None:
        return
    chars = 0
    for msg in req.messages:
        content = msg.content
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(part.text or "") for part in content)
        _too_long(chars, limit, "messages")


def check_completion_limits(req: CompletionRequest, config: ServerConfig) -> None:
    limit = config.max_prompts_per_request
    count = num_prompts(req.prompt)
    if limit is not None and count > limit:
        raise bad_request(f"The request holds {count} prompts; this server takes at most "
                          f"{limit} (--max-prompts-per-request).", "prompt")
    limit = config.max_prompt_chars
    if limit is None:
        return
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    _too_long(sum(len(p) for p in prompts if isinstance(p, str)), limit, "prompt")
