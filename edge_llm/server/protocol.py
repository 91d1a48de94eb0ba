"""OpenAI request and response bodies as msgspec Structs.

Request structs mirror OpenAI's schema plus the extra fields vLLM and llama.cpp's server
accept (structured outputs: ``response_format``, ``guided_*``, ``structured_outputs``,
``json_schema``, ``grammar``; tools). Unknown fields are ignored (msgspec's default), as OpenAI
does, except the fields other servers document as changing generation that are not served
here (``REFUSED_FIELDS``): they are read so that they get a 400 naming them.
Types are checked by msgspec while Litestar decodes the body; value
ranges are checked by ``SamplingParams`` and ``preprocess``.
Response structs serialise to exactly OpenAI's JSON (``None`` fields are written as ``null``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

# JSON numbers too large for an int64 are a client error, not an engine crash.
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Count = Annotated[int, Meta(ge=0, le=2**31 - 1)]


class ContentPart(Struct):
    """One part of a message's content; only ``{"type": "text", "text": ...}`` is served."""

    type: str
    text: str | None = None


class ChatMessage(Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers
    reasoning_content: str | None = None  # sent back by some clients; not rendered


class JsonSchemaFormat(Struct):
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(Struct):
    type: str  # "text", "json_object" or "json_schema"
    json_schema: JsonSchemaFormat | None = None


# Fields that vLLM, llama.cpp's server, Ollama or OpenAI document as changing what is generated
# and that are not served here: a request setting one gets a 400 naming it.
REFUSED_FIELDS: tuple[str, ...] = (
    "use_beam_search", "length_penalty", "early_stopping", "bad_words", "logits_processors",
    "guided_whitespace_pattern", "guided_decoding_backend", "return_tokens_as_token_ids",
    "documents", "mirostat", "mirostat_tau", "mirostat_eta", "typical_p", "tfs_z",
    "dynatemp_range", "dynatemp_exponent", "xtc_probability", "xtc_threshold",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "repeat_last_n", "repeat_penalty", "penalize_nl", "n_probs",
    "samplers", "top_n_sigma", "n_predict", "n_keep", "format", "audio", "web_search_options",
    "verbosity",
)


_NULL_DEFAULTS: dict[type, tuple[tuple[str, Any], ...]] = {}


class _Request(Struct, kw_only=True):
    """OpenAI's optional fields may be sent as ``null``: such a field takes its default.
    (Fields whose default is not None are typed ``T | None`` for that; after decoding they
    never hold None.)"""

    def __post_init__(self) -> None:
        cls = type(self)
        defaults = _NULL_DEFAULTS.get(cls)
        if defaults is None:
            defaults = _NULL_DEFAULTS[cls] = tuple(
                (f.name, f.default) for f in msgspec.structs.fields(cls)
                if f.default is not None and f.default is not msgspec.NODEFAULT)
        for name, default in defaults:
            if getattr(self, name) is None:
                setattr(self, name, default)


class StreamOptions(_Request):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class SamplingFields(_Request, kw_only=True):
    """Fields shared by both endpoints, named as OpenAI and vLLM name them."""

    model: str | None = None
    max_tokens: Count | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: Count | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extra sampling fields
    top_k: Int64 | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: Count | None = 0
    ignore_eos: bool | None = False
    stop_token_ids: list[Int64] | None = None
    skip_special_tokens: bool | None = True
    include_stop_str_in_output: bool | None = False
    allowed_token_ids: list[Int64] | None = None
    truncate_prompt_tokens: Int64 | None = None
    # vLLM's scheduling priority (lower first); scheduling here is first come, first served
    priority: Int64 | None = 0
    # vLLM's prompt logprobs (not served: read to refuse them)
    prompt_logprobs: Int64 | None = None
    # structured outputs, as OpenAI, vLLM and llama.cpp's server name them (one at most)
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    # fields refused with a 400 naming them (REFUSED_FIELDS)
    use_beam_search: Any = None
    length_penalty: Any = None
    early_stopping: Any = None
    bad_words: Any = None
    logits_processors: Any = None
    guided_whitespace_pattern: Any = None
    guided_decoding_backend: Any = None
    return_tokens_as_token_ids: Any = None
    documents: Any = None
    mirostat: Any = None
    mirostat_tau: Any = None
    mirostat_eta: Any = None
    typical_p: Any = None
    tfs_z: Any = None
    dynatemp_range: Any = None
    dynatemp_exponent: Any = None
    xtc_probability: Any = None
    xtc_threshold: Any = None
    dry_multiplier: Any = None
    dry_base: Any = None
    dry_allowed_length: Any = None
    dry_penalty_last_n: Any = None
    dry_sequence_breakers: Any = None
    repeat_last_n: Any = None
    repeat_penalty: Any = None
    penalize_nl: Any = None
    n_probs: Any = None
    samplers: Any = None
    top_n_sigma: Any = None
    n_predict: Any = None
    n_keep: Any = None
    format: Any = None
    audio: Any = None
    web_search_options: Any = None
    verbosity: Any = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: Count | None = None
    logprobs: bool | None = False
    top_logprobs: Count | None = None
    add_generation_prompt: bool | None = True
    # vLLM's chat extras: continue the final (assistant) message instead of opening a new
    # one; variables for the chat template; special tokens added on top of the template's
    continue_final_message: bool | None = False
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool | None = None
    # tools; and OpenAI and vLLM fields that change what must come back, read so that
    # preprocess can refuse what this server cannot honour instead of ignoring it
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = True
    reasoning_effort: str | None = None  # passed to the chat template, as vLLM does
    functions: list[Any] | None = None
    function_call: Any = None
    echo: bool | None = False
    chat_template: str | None = None


class CompletionRequest(SamplingFields, kw_only=True):
    # a string, a list of strings, a list of token ids or a list of token-id lists;
    # msgspec allows one array type per union, so the element kinds are checked in preprocess
    prompt: str | list[str | Int64 | list[Int64]]
    logprobs: Count | None = None
    echo: bool | None = False
    suffix: str | None = None
    best_of: Count | None = None


# ---- responses ---------------------------------------------------------------------------


class PromptTokensDetails(Struct):
    cached_tokens: int = 0


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Struct):
    content: list[TokenLogprob] | None


class CompletionLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class FunctionCall(Struct):
    name: str
    arguments: str


class ToolCallOut(Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class AssistantMessage(Struct, omit_defaults=True):
    role: str
    content: str | None
    tool_calls: list[ToolCallOut] = msgspec.field(default_factory=list)
    reasoning_content: str | None = None


class FunctionDelta(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDeltaOut(Struct, omit_defaults=True):
    index: int
    id: str | None = None
    type: str | None = None
    function: FunctionDelta | None = None


class ChatChoice(Struct):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None


class Delta(Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDeltaOut] | None = None


class ChatChunkChoice(Struct):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    system_fingerprint: str | None = None
    usage: Usage | None = None


class CompletionChoice(Struct):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class Completion(Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None
    object: Literal["text_completion"] = "text_completion"
    system_fingerprint: str | None = None


class ModelCard(Struct):
    id: str
    created: int
    owned_by: str = "edge-llm"
    root: str | None = None
    max_model_len: int | None = None
    object: Literal["model"] = "model"


class ModelList(Struct):
    data: list[ModelCard]
    object: Literal["list"] = "list"


class ErrorInfo(Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(Struct):
    error: ErrorInfo


def to_json(obj: Any) -> bytes:
    """Serialise a response struct (or plain data) to JSON bytes."""
    return msgspec.json.encode(obj)
