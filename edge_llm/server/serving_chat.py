"""``POST /v1/chat/completions``: one engine request with ``n`` choices."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from litestar import Request, Response

from edge_llm.outputs import RequestOutput

from .chat_reply import ReplyReader, call_deltas, read_whole
from .context import ServerContext, record_usage, until_disconnect
from .generation import collect, generate_one
from .limits import chat_sequences, check_chat_limits
from .logprobs import TokenTexts, chat_logprobs
from .preprocess import ChatPlan, Prompt, chat_request, check_model
from .protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatLogprobs,
    Delta,
    PromptTokensDetails,
    Usage,
)
from .sse import prime, sse_events, sse_response


def usage_of(outs: list[RequestOutput]) -> Usage:
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
    cached = sum(o.num_cached_tokens for o in outs)
    return Usage(prompt, completion, prompt + completion, PromptTokensDetails(cached))


async def chat_completions(ctx: ServerContext, req: ChatCompletionRequest,
                           request: Request) -> Response:
    check_chat_limits(req, ctx.config)
    engine, ticket = await until_disconnect(request, ctx.holder.admit(chat_sequences(req)))
    streaming = False  # from here on the stream's end releases the ticket
    try:
        check_model(req.model, ctx.served_names())
        cfg = ctx.config
        prompt, params, plan = await ctx.off_loop(
            chat_request, req, engine, ctx.chat_template, cfg.tool_call_parser,
            cfg.reasoning_parser, ctx.defaults)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        model = ctx.model_name()
        created = int(time.time())
        top = params.logprobs if params.logprobs is not None else None
        stream = generate_one(engine, prompt.token_ids, params, request_id,
                              ctx.metrics.tracker(request), prompt_param="messages")
        if not req.stream:
            (final,) = await until_disconnect(request, collect([stream]))
            usage = usage_of([final])
            record_usage(request, usage.prompt_tokens, usage.completion_tokens)
            body = _completion(final, request_id, created, model,
                               ctx.token_texts(engine), top, usage, plan, prompt)
            return Response(body, status_code=200)
        outputs = await until_disconnect(request, prime(stream))
        streaming = True
    finally:
        if not streaming:
            ticket.release()
    opts = req.stream_options
    include_usage = bool(opts and opts.include_usage)
    continuous = include_usage and bool(opts.continuous_usage_stats)
    chunks = _chunks(outputs, request_id, created, model, params.n, ctx.token_texts(engine),
                     top, (include_usage, continuous), prompt, request, plan)
    return sse_response(sse_events(chunks, ticket.release), [chunks, outputs], ticket.release)


def _completion(final: RequestOutput, request_id: str, created: int, model: str,
                texts: TokenTexts, top: int | None, usage: Usage, plan: ChatPlan,
                prompt: Prompt) -> ChatCompletion:
    choices = []
    for c in final.outputs:
        lps = None
        if top is not None and c.logprobs is not None:
            lps = chat_logprobs(texts, c.token_ids, c.logprobs, top)
        content, reasoning, calls, reader = read_whole(plan, prompt.text, c.text)
        message = AssistantMessage("assistant", content, calls, reasoning)
        choices.append(ChatChoice(c.index, message, lps, reader.finish_reason(c.finish_reason)))
    return ChatCompletion(request_id, created, model, choices, usage)


async def _chunks(
    outputs: AsyncIterator[RequestOutput],
    request_id: str, created: int, model: str, n: int, texts: TokenTexts, top: int | None,
    usage_opts: tuple[bool, bool], prompt: Prompt, request: Request, plan: ChatPlan,
) -> AsyncIterator[ChatCompletionChunk]:
    """Role chunk per choice, content deltas, ``finish_reason`` on each choice's last chunk,
    then (``include_usage``, the first of ``usage_opts``) a chunk with no choices carrying
    ``usage``; with the second (vLLM's ``continuous_usage_stats``) every chunk carries the
    usage so far."""
    include_usage, continuous = usage_opts
    completion_tokens = 0

    def chunk(choice: ChatChunkChoice) -> ChatCompletionChunk:
        usage = None
        if continuous:
            n = len(prompt.token_ids)
            usage = Usage(n, completion_tokens, n + completion_tokens)
        return ChatCompletionChunk(request_id, created, model, [choice], usage=usage)

    for i in range(n):
        yield chunk(ChatChunkChoice(i, Delta(role="assistant", content="")))
    finished: set[int] = set()
    readers = [ReplyReader(plan, prompt.text) for _ in range(n)]
    last: RequestOutput | None = None
    try:
        async for out in outputs:
            last = out
            for c in out.outputs:
                newly_done = c.finish_reason is not None and c.index not in finished
                if not (c.text_delta or c.token_ids_delta or newly_done):
                    continue
                completion_tokens += len(c.token_ids_delta)
                lps = None
                if top is not None and c.logprobs_delta:
                    lps = chat_logprobs(texts, c.token_ids_delta, c.logprobs_delta, top)
                elif top is not None:
                    lps = ChatLogprobs([])
                reader = readers[c.index]
                reasoning, parsed = reader.feed(c.text_delta)
                reason = None
                if newly_done:
                    finished.add(c.index)
                    more_reasoning, more = reader.finish()
                    reasoning += more_reasoning
                    parsed.extend(more)
                    reason = reader.finish_reason(c.finish_reason)
                delta = Delta(content=parsed.content or None,
                              reasoning_content=reasoning or None,
                              tool_calls=call_deltas(parsed))
                if delta == Delta() and not (newly_done or lps is not None):
                    continue  # text held back by a parser (a tag or a call in progress)
                yield chunk(ChatChunkChoice(c.index, delta, lps, reason))
    finally:
        record_usage(request, len(prompt.token_ids), completion_tokens)
    if include_usage and last is not None:
        usage = usage_of([last])
        yield ChatCompletionChunk(request_id, created, model, [], usage=usage)
