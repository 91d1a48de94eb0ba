"""Requests -> (prompt token ids, SamplingParams), with every bad value a 400 naming its field.

The server tokenizes (so it knows prompt lengths for ``max_tokens`` and ``usage``) and hands the
engine token ids. As the engine does for text: special tokens are added unless the text already
starts with the BOS token (a rendered chat template usually does).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_llm.sampling_params import SamplingParams

from . import reasoning_parsers, tool_parsers
from .chat_tools import ToolPlan, structured_spec, template_messages, tool_plan
from .engine_api import ServingEngine
from .errors import OpenAIError, bad_request, param_from_value_error
from .protocol import (
    REFUSED_FIELDS,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
)
from .request_defaults import RequestDefaults

_NO_DEFAULTS = RequestDefaults(max_tokens=None)  # vLLM without a generation config

ROLES = ("system", "developer", "user", "assistant", "tool")
SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))


@dataclass
class Prompt:
    token_ids: list[int]
    text: str | None  # None for a token-id prompt (echo decodes it)


@dataclass
class ChatPlan:
    """How a chat reply is read back: tool calls (``tools``) and reasoning (``reasoning``:
    a ``reasoning_parsers`` kind, or None)."""

    tools: ToolPlan
    reasoning: str | None = None


def read_chat_template(value: str | None) -> str | None:
    """``--chat-template``: a file's contents, or the value itself as an inline template."""
    if not value:
        return None
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "{" not in value:  # neither a file nor Jinja: most likely a mistyped path
        raise ValueError(f"chat_template: no such file: {value}")
    return value


def messages_to_dicts(messages: list[ChatMessage]) -> list[dict[str, str]]:
    if not messages:
        raise bad_request("messages must hold at least one message.", "messages")
    out = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if msg.role not in ROLES:
            raise bad_request(
                f"{where}.role must be one of {', '.join(ROLES)}, got {msg.role!r}.",
                f"{where}.role",
            )
        content = msg.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise bad_request(
                        f"{where}.content[{j}]: only text parts are supported, got "
                        f"type {part.type!r}.", f"{where}.content",
                    )
                texts.append(part.text)
            content = "\n".join(texts)
        if msg.tool_calls:
            _check_tool_calls(msg, where)
        if content is None:
            if msg.role != "assistant":
                raise bad_request(f"{where}.content is required for role {msg.role!r}.",
                                  f"{where}.content")
            content = ""
        role = "system" if msg.role == "developer" else msg.role
        entry = {"role": role, "content": content}
        if msg.name:
            entry["name"] = msg.name
        if msg.tool_calls:
            entry["tool_calls"] = msg.tool_calls
        if msg.tool_call_id is not None:
            entry["tool_call_id"] = msg.tool_call_id
        out.append(entry)
    return out


def _check_tool_calls(msg: ChatMessage, where: str) -> None:
    if msg.role != "assistant":
        raise bad_request(f"{where}.tool_calls is only allowed on assistant messages.",
                          f"{where}.tool_calls")
    for j, call in enumerate(msg.tool_calls or []):
        fn = call.get("function")
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)
                and isinstance(fn.get("arguments", ""), (str, dict))):
            raise bad_request(f"{where}.tool_calls[{j}] must be {{'id': ..., 'type': "
                              "'function', 'function': {'name': ..., 'arguments': ...}}.",
                              f"{where}.tool_calls")


def render_chat(engine: ServingEngine, messages: list[dict], template: str | None,
                add_generation_prompt: bool, **kwargs: Any) -> str:
    """The chat prompt text: ``template`` if given, else the engine's (tokenizer's) template.
    ``kwargs``: ``continue_final_message`` and template variables."""
    try:
        if template is not None:
            return engine.tokenizer.apply_chat_template(
                messages, chat_template=template, tokenize=False,
                add_generation_prompt=add_generation_prompt, **kwargs,
            )
        return engine.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                          **kwargs)
    except ValueError as exc:
        raise bad_request(str(exc), "messages") from exc
    except Exception as exc:  # jinja2 TemplateError: e.g. a template refusing a role order
        raise bad_request(f"The chat template failed on these messages: {exc}",
                          "messages") from exc


def tokenize_text(tokenizer: Any, text: str, add_special_tokens: bool | None = None
                  ) -> list[int]:
    """Token ids of ``text``; special tokens added as asked, by default unless the text
    already starts with the BOS token."""
    add = add_special_tokens
    if add is None:
        bos = getattr(tokenizer, "bos_token", None)
        add = not (bos and text.startswith(bos))
    return list(tokenizer.encode(text, add_special_tokens=add))


def completion_prompts(tokenizer: Any, prompt: Any) -> list[Prompt]:
    """``prompt``: a string, strings, token ids or token-id lists -> one Prompt each."""
    if isinstance(prompt, str):
        return [Prompt(tokenize_text(tokenizer, prompt), prompt)]
    if not prompt:
        raise bad_request("prompt must not be empty.", "prompt")
    if all(isinstance(p, str) for p in prompt):
        return [Prompt(tokenize_text(tokenizer, p), p) for p in prompt]
    if all(isinstance(p, int) for p in prompt):
        return [Prompt(_check_ids(tokenizer, prompt, "prompt"), None)]
    if all(isinstance(p, list) for p in prompt):
        return [Prompt(_check_ids(tokenizer, p, f"prompt[{i}]"), None)
                for i, p in enumerate(prompt)]
    raise bad_request("prompt must be a string, a list of strings, a list of token ids or a "
                      "list of token-id lists (not a mix).", "prompt")


def _check_ids(tokenizer: Any, ids: list, where: str) -> list[int]:
    vocab = len(tokenizer)
    if not ids:
        raise bad_request(f"{where} must not be empty.", "prompt")
    for t in ids:
        if not isinstance(t, int) or not 0 <= t < vocab:
            raise bad_request(f"{where} holds token id {t!r}, outside [0, {vocab}).", "prompt")
    return list(ids)


def truncated(prompt: Prompt, keep: int | None, max_model_len: int) -> Prompt:
    """vLLM's ``truncate_prompt_tokens``: the last ``keep`` tokens (-1: the context length);
    the text then no longer matches, and echo decodes the ids kept."""
    if keep is None:
        return prompt
    if keep == 0 or keep < -1:
        raise bad_request(f"truncate_prompt_tokens must be -1 or >= 1, got {keep}.",
                          "truncate_prompt_tokens")
    ids = prompt.token_ids[-(max_model_len if keep == -1 else keep):]
    return prompt if len(ids) == len(prompt.token_ids) else Prompt(ids, None)


def check_context(prompt_len: int, max_tokens: int | None, max_model_len: int,
                  param: str, max_param: str = "max_tokens") -> int:
    """``max_tokens`` to use: the room left when None; 400 when prompt + output do not fit
    (naming ``param``, the prompt's field, or ``max_param``, the one that asked for it)."""
    if prompt_len >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt "
            f"has {prompt_len} tokens. Please reduce the length of the prompt.", param)
    if max_tokens is None:
        return max_model_len - prompt_len
    if prompt_len + max_tokens > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
            f"{max_tokens} in the completion). Please reduce the length of the prompt or "
            f"{max_param}.", max_param)
    return max_tokens


def sampling_params(req: SamplingFields, tokenizer: Any, *, max_tokens: int,
                    logprobs: int | None, prompt_logprobs: int | None = None,
                    defaults: RequestDefaults = _NO_DEFAULTS) -> SamplingParams:
    """Build and validate; a bad value is a 400 naming the request field. Sampling fields
    the request leaves out come from ``defaults.sampling`` (the model's generation config)."""
    vocab = len(tokenizer)
    bias = None
    if req.logit_bias:
        bias = {}
        for key, value in req.logit_bias.items():
            try:
                tok = int(key)
            except ValueError:
                raise bad_request(f"logit_bias keys must be token ids, got {key!r}.",
                                  "logit_bias") from None
            if not 0 <= tok < vocab:
                raise bad_request(f"logit_bias key {tok} is outside [0, {vocab}).", "logit_bias")
            bias[tok] = value
    for name in ("stop_token_ids", "allowed_token_ids"):
        for t in getattr(req, name) or []:
            if not 0 <= t < vocab:
                raise bad_request(f"{name} holds {t}, outside [0, {vocab}).", name)
    kw: dict[str, Any] = dict(
        n=req.n, presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty, seed=req.seed, stop=req.stop,
        stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos, max_tokens=max_tokens,
        min_tokens=req.min_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
        logit_bias=bias, skip_special_tokens=req.skip_special_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output,
        allowed_token_ids=req.allowed_token_ids,
        truncate_prompt_tokens=req.truncate_prompt_tokens,
    )
    for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
        value = getattr(req, name)
        if value is None:
            value = defaults.sampling.get(name)
        if value is not None:
            kw[name] = value
    try:
        return SamplingParams(**kw)
    except ValueError as exc:
        raise bad_request(str(exc), param_from_value_error(str(exc), SAMPLING_FIELDS)) from exc
    except TypeError as exc:  # e.g. a comparison of an unexpected type
        raise bad_request(f"Invalid sampling parameters: {exc}", None) from exc


def check_common(req: SamplingFields) -> None:
    """What both endpoints refuse: stream options without streaming (as OpenAI and vLLM do),
    vLLM's prompt logprobs (not served; the completions endpoint's ``echo`` with
    ``logprobs`` gives them), a non-zero vLLM ``priority`` (as vLLM refuses it without
    priority scheduling) and the generation fields of other servers not served here."""
    refused = [name for name in REFUSED_FIELDS if getattr(req, name) is not None]
    if refused:
        raise bad_request(f"Not supported by this server (they would change the output): "
                          f"{', '.join(refused)}.", refused[0])
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options can only be set when stream is true.",
                          "stream_options")
    if req.prompt_logprobs is not None:
        raise bad_request("prompt_logprobs is not supported: use the completions endpoint "
                          "with echo and logprobs.", "prompt_logprobs")
    if req.priority != 0:  # vLLM's answer when its --scheduling-policy is fcfs (its default)
        raise bad_request(f"Got priority {req.priority} but priority scheduling is not enabled: "
                          "requests are served first come, first served.", "priority")


def check_chat_features(req: ChatCompletionRequest) -> None:
    """Refuse what would change the answer and is not served: vLLM's chat ``echo`` and a
    per-request template."""
    check_common(req)
    if req.echo:
        raise bad_request("echo is not supported on the chat endpoint.", "echo")
    if req.chat_template is not None:
        raise bad_request("A per-request chat_template is not accepted: start the server with "
                          "--chat-template instead.", "chat_template")
    if req.continue_final_message and req.add_generation_prompt:
        raise bad_request("continue_final_message and add_generation_prompt cannot both be "
                          "true: set add_generation_prompt to false to continue the final "
                          "message.", "continue_final_message")


def constraint(req: SamplingFields, engine: ServingEngine, plan_spec: Any = None) -> Any:
    """The request's ``StructuredOutputsParams`` (or None), compiled once here so that a
    schema the engine cannot enforce is a 400 naming the field that sent it."""
    spec, field = structured_spec(req)
    if plan_spec is not None:
        if spec is not None:
            raise bad_request(f"{field} cannot be combined with tool_choice 'required' or a "
                              "named function.", field)
        spec, field = plan_spec, "tools"
    if spec is None:
        return None
    grammars = engine.grammars
    if grammars is None:
        raise bad_request("This engine does not constrain outputs.", field)
    try:
        grammars.compile(spec)
    except ValueError as exc:
        raise bad_request(f"{field}: {exc}", field) from None
    return spec


def template_text(engine: ServingEngine, template: str | None) -> str | None:
    """The chat template in use (the override, else the tokenizer's)."""
    if template is not None:
        return template
    own = getattr(engine.tokenizer, "chat_template", None)
    return own if isinstance(own, str) else None


def _parser_choice(flag: str | None, detected: str | None) -> str | None:
    if flag in (None, "auto"):
        return detected
    return None if flag == "none" else flag


def chat_inputs(req: ChatCompletionRequest, engine: ServingEngine, template: str | None,
                defaults: RequestDefaults = _NO_DEFAULTS) -> tuple[Prompt, SamplingParams]:
    prompt, params, _ = chat_request(req, engine, template, defaults=defaults)
    return prompt, params


def chat_request(req: ChatCompletionRequest, engine: ServingEngine, template: str | None,
                 tool_call_parser: str | None = "auto", reasoning_parser: str | None = "auto",
                 defaults: RequestDefaults = _NO_DEFAULTS
                 ) -> tuple[Prompt, SamplingParams, ChatPlan]:
    """Prompt, sampling params and how to read the reply back. ``tool_call_parser`` /
    ``reasoning_parser``: the server's flags (``auto``: from the chat template).
    ``defaults``: what the request leaves out (sampling fields; max_tokens, capped at the
    room the context leaves)."""
    check_chat_features(req)
    source = template_text(engine, template)
    parser = _parser_choice(tool_call_parser, tool_parsers.parser_of_template(source))
    plan, plan_spec = tool_plan(req, parser)
    spec = constraint(req, engine, plan_spec)
    messages = template_messages(messages_to_dicts(req.messages),
                                 tool_parsers.parser_of_template(source) is not None
                                 or "tool_calls" in (source or ""))
    extra: dict[str, Any] = dict(req.chat_template_kwargs or {})
    for name in ("add_generation_prompt", "continue_final_message", "chat_template",
                 "messages", "tokenize"):
        if name in extra:
            raise bad_request(f"chat_template_kwargs must not set {name!r}.",
                              "chat_template_kwargs")
    if req.continue_final_message:
        extra["continue_final_message"] = True
    if plan.tools:
        extra["tools"] = plan.tools
    if req.reasoning_effort is not None:
        extra.setdefault("reasoning_effort", req.reasoning_effort)
    text = render_chat(engine, messages, template, req.add_generation_prompt, **extra)
    prompt = truncated(Prompt(tokenize_text(engine.tokenizer, text, req.add_special_tokens),
                              text), req.truncate_prompt_tokens, engine.max_model_len)
    if not prompt.token_ids:
        raise bad_request("The rendered chat prompt is empty.", "messages")
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs set to true.", "top_logprobs")
    if req.top_logprobs is not None and req.top_logprobs > 20:
        raise bad_request(f"top_logprobs must be in [0, 20], got {req.top_logprobs}.",
                          "top_logprobs")
    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    if asked == 0:
        raise bad_request(f"{param} must be at least 1, got 0.", param)
    max_tokens = check_context(len(prompt.token_ids), asked, engine.max_model_len, "messages",
                               param)
    if asked is None and defaults.max_tokens is not None:
        max_tokens = min(max_tokens, defaults.max_tokens)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = sampling_params(req, engine.tokenizer, max_tokens=max_tokens, logprobs=logprobs,
                             defaults=defaults)
    params.structured_outputs = spec
    reasoning = _parser_choice(reasoning_parser, reasoning_parsers.parser_of_template(source))
    return prompt, params, ChatPlan(plan, reasoning)


def completion_inputs(req: CompletionRequest, engine: ServingEngine,
                      defaults: RequestDefaults = _NO_DEFAULTS
                      ) -> tuple[list[Prompt], list[SamplingParams]]:
    """One (prompt, params) per prompt; params differ only in the ``max_tokens`` left.
    ``echo`` with ``max_tokens`` 0 scores the prompt (vLLM's echo without generation): one
    token is generated, and the response leaves it out."""
    check_common(req)
    if req.suffix:
        raise bad_request("suffix is not supported.", "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request(f"best_of must equal n ({req.n}) here: generating more completions "
                          f"than are returned is not supported, got {req.best_of}.", "best_of")
    if req.logprobs is not None and req.logprobs > 20:
        raise bad_request(f"logprobs must be in [0, 20], got {req.logprobs}.", "logprobs")
    if req.max_tokens == 0 and not req.echo:
        raise bad_request("max_tokens must be at least 1, got 0 (0 is allowed with echo, to "
                          "score the prompt).", "max_tokens")
    prompts = [truncated(p, req.truncate_prompt_tokens, engine.max_model_len)
               for p in completion_prompts(engine.tokenizer, req.prompt)]
    spec = constraint(req, engine)
    prompt_lp = req.logprobs if (req.echo and req.logprobs is not None) else None
    max_tokens = 16 if req.max_tokens is None else max(req.max_tokens, 1)  # OpenAI's default
    params = []
    for p in prompts:
        mt = check_context(len(p.token_ids), max_tokens, engine.max_model_len, "prompt")
        sp = sampling_params(req, engine.tokenizer, max_tokens=mt, logprobs=req.logprobs,
                             prompt_logprobs=prompt_lp, defaults=defaults)
        sp.structured_outputs = spec
        params.append(sp)
    return prompts, params


def check_model(requested: str | None, served: list[str]) -> None:
    if requested and requested not in served:
        raise OpenAIError(404, f"The model `{requested}` does not exist.", param="model",
                          code="model_not_found")
