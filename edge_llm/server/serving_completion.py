"""``POST /v1/completions``: one engine request per prompt, ``n`` choices each.

Choice ``index`` is ``prompt_index * n + choice``, as OpenAI numbers a batch of prompts.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from litestar import Request, Response

from edge_llm.outputs import CompletionOutput, RequestOutput

from .context import ServerContext, record_usage, until_disconnect
from .generation import collect, generate_one, merged
from .limits import check_completion_limits, completion_sequences
from .logprobs import TokenTexts, completion_logprobs, merge_completion_logprobs
from .preprocess import Prompt, check_model, completion_inputs
from .protocol import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, Usage
from .serving_chat import usage_of
from .sse import prime, sse_events, sse_response


async def completions(ctx: ServerContext, req: CompletionRequest, request: Request) -> Response:
    check_completion_limits(req, ctx.config)
    engine, ticket = await until_disconnect(request,
                                            ctx.holder.admit(completion_sequences(req)))
    streaming = False  # from here on the stream's end releases the ticket
    try:
        check_model(req.model, ctx.served_names())
        prompts, params = await ctx.off_loop(completion_inputs, req, engine, ctx.defaults)
        base_id = f"cmpl-{uuid.uuid4().hex}"
        model, created, texts = ctx.model_name(), int(time.time()), ctx.token_texts(engine)
        view = _View(req, prompts, texts)
        streams = [
            generate_one(engine, p.token_ids, sp, f"{base_id}-{i}", ctx.metrics.tracker(request))
            for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
        ]
        if not req.stream:
            finals = await until_disconnect(request, collect(streams))
            usage = view.usage(finals)
            record_usage(request, usage.prompt_tokens, usage.completion_tokens)
            choices = [view.whole_choice(i, f, c) for i, f in enumerate(finals) for c in f.outputs]
            choices.sort(key=lambda ch: ch.index)
            body = Completion(base_id, created, model, choices, usage)
            return Response(body, status_code=200)
        outputs = await until_disconnect(request, prime(merged(streams)))
        streaming = True
    finally:
        if not streaming:
            ticket.release()
    opts = req.stream_options
    include_usage = bool(opts and opts.include_usage)
    chunks = _chunks(outputs, view, base_id, created, model, include_usage,
                     include_usage and bool(opts.continuous_usage_stats), request)
    return sse_response(sse_events(chunks, ticket.release), [chunks, outputs], ticket.release)


class _View:
    """Turns engine outputs into completion choices (echo, logprobs, indices)."""

    def __init__(self, req: CompletionRequest, prompts: list[Prompt], texts: TokenTexts) -> None:
        self.n = req.n
        self.echo = req.echo
        # echo with max_tokens 0: the prompt alone (its one generated token is left out)
        self.prompt_only = bool(req.echo and req.max_tokens == 0)
        self.top = req.logprobs
        self.prompts = prompts
        self.texts = texts

    def prompt_text(self, i: int) -> str:
        p = self.prompts[i]
        if p.text is None:
            p.text = self.texts.tokenizer.decode(p.token_ids)
        return p.text

    def prompt_logprobs(self, i: int, out: RequestOutput) -> CompletionLogprobs:
        ids = self.prompts[i].token_ids
        lps = list(out.prompt_logprobs or [])
        lps += [None] * (len(ids) - len(lps))  # the first prompt token never has one
        assert self.top is not None
        return completion_logprobs(self.texts, ids, lps[: len(ids)], self.top, 0)

    def usage(self, outs: list[RequestOutput]) -> Usage:
        usage = usage_of(outs)
        if self.prompt_only:
            usage.completion_tokens, usage.total_tokens = 0, usage.prompt_tokens
        return usage

    def whole_choice(self, i: int, final: RequestOutput, c: CompletionOutput) -> CompletionChoice:
        if self.prompt_only:
            return self.prompt_choice(i, c, final)
        return self.piece(i, c, first=True, text=c.text, token_ids=c.token_ids,
                          logprobs=c.logprobs, offset=0, out=final)

    def prompt_choice(self, i: int, c: CompletionOutput, out: RequestOutput) -> CompletionChoice:
        """The echoed prompt alone, finished by length (echo with max_tokens 0)."""
        choice = self.piece(i, c, first=True, text="", token_ids=[], logprobs=[], offset=0,
                            out=out)
        choice.finish_reason = "length"
        return choice

    def piece(self, i: int, c: CompletionOutput, *, first: bool, text: str,
              token_ids: list[int], logprobs: list | None, offset: int,
              out: RequestOutput, finish: bool = True) -> CompletionChoice:
        """A choice holding ``text`` (and the echoed prompt before it when ``first``)."""
        parts: list[CompletionLogprobs] = []
        if first and self.echo:
            prompt = self.prompt_text(i)
            if self.top is not None:
                parts.append(self.prompt_logprobs(i, out))
            text, offset = prompt + text, offset + len(prompt)
        if self.top is not None:
            parts.append(completion_logprobs(self.texts, token_ids, logprobs or [], self.top,
                                             offset))
        lps = merge_completion_logprobs(parts) if self.top is not None else None
        reason = c.finish_reason if finish else None
        return CompletionChoice(i * self.n + c.index, text, lps, reason)


async def _chunks(outputs: AsyncIterator[tuple[int, RequestOutput]], view: _View,
                  base_id: str, created: int, model: str, include_usage: bool,
                  continuous_usage: bool, request: Request) -> AsyncIterator[Completion]:
    """A chunk per choice's new text (the echoed prompt first), ``finish_reason`` on each
    choice's last chunk, then (``include_usage``) a chunk with no choices carrying the usage
    of all prompts; ``continuous_usage`` (vLLM's ``continuous_usage_stats``) adds each chunk's
    prompt's usage so far to it."""
    started: set[int] = set()
    finished: set[int] = set()
    offsets: dict[int, int] = {}  # characters sent so far per choice (logprobs text_offset)
    lasts: dict[int, RequestOutput] = {}
    try:
        async for i, out in outputs:
            lasts[i] = out
            for c in out.outputs:
                index = i * view.n + c.index
                first = index not in started
                newly_done = c.finish_reason is not None and index not in finished
                if not (c.text_delta or c.token_ids_delta or newly_done or (first and view.echo)):
                    continue
                if view.prompt_only and not newly_done:
                    continue
                started.add(index)
                if newly_done:
                    finished.add(index)
                if view.prompt_only:
                    choice = view.prompt_choice(i, c, out)
                else:
                    choice = view.piece(i, c, first=first, text=c.text_delta,
                                        token_ids=c.token_ids_delta, logprobs=c.logprobs_delta,
                                        offset=offsets.get(index, 0), out=out,
                                        finish=newly_done)
                offsets[index] = offsets.get(index, 0) + len(choice.text)
                usage = view.usage([out]) if continuous_usage else None
                yield Completion(base_id, created, model, [choice], usage)
    finally:
        if lasts:
            usage = view.usage(list(lasts.values()))
            record_usage(request, usage.prompt_tokens, usage.completion_tokens)
    if include_usage and lasts:
        yield Completion(base_id, created, model, [], view.usage(list(lasts.values())))
