"""Route handlers: thin wrappers that find the app's ``ServerContext`` and delegate."""

from __future__ import annotations

import hmac
from functools import cache
from importlib import resources
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, Router, get, post
from litestar.connection import ASGIConnection
from litestar.enums import RequestEncodingType
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Body, FromPath, QueryParameter

from .context import ServerContext, until_disconnect
from .engine_api import ServingEngine
from .errors import OpenAIError, bad_request
from .metrics import CONTENT_TYPE
from .preprocess import check_model
from .protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from .serving_chat import chat_completions as serve_chat
from .serving_completion import completions as serve_completions
from .serving_tokenization import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    detokenize,
    tokenize,
    tokenizer_info,
)

_ERRORS = {code: ResponseSpec(ErrorResponse, description=what) for code, what in (
    (400, "Invalid request"), (401, "Missing or wrong API key"), (404, "Unknown model"),
    (413, "Body too large"), (429, "Queue full"), (500, "Engine failure"),
    (503, "Model loading"))}
ChatBody = Annotated[ChatCompletionRequest, Body(media_type=RequestEncodingType.JSON)]
CompletionBody = Annotated[CompletionRequest, Body(media_type=RequestEncodingType.JSON)]
TokenizeBody = Annotated[TokenizeRequest, Body(media_type=RequestEncodingType.JSON)]
DetokenizeBody = Annotated[DetokenizeRequest, Body(media_type=RequestEncodingType.JSON)]


def ctx_of(conn: ASGIConnection) -> ServerContext:
    return conn.app.state.ctx


async def require_api_key(conn: ASGIConnection, _: BaseRouteHandler) -> None:
    """Guard of every /v1 route when ``api_key`` is set: ``Authorization: Bearer <key>``.
    A coroutine: Litestar runs a plain function guard in a worker thread, a hop per request."""
    key = ctx_of(conn).config.api_key
    if not key:
        return
    scheme, _, token = conn.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        token.strip().encode("utf-8"), key.encode("utf-8")
    ):
        raise OpenAIError(401, "Invalid or missing API key: send 'Authorization: Bearer <key>'.",
                          code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


@post("/chat/completions", status_code=200,
      responses={200: ResponseSpec(ChatCompletion), **_ERRORS},
      summary="Chat completion (OpenAI); text/event-stream when stream is true")
async def chat_completions(data: ChatBody, request: Request) -> Response:
    return await serve_chat(ctx_of(request), data, request)


@post("/completions", status_code=200, responses={200: ResponseSpec(Completion), **_ERRORS},
      summary="Text completion (OpenAI); text/event-stream when stream is true")
async def completions(data: CompletionBody, request: Request) -> Response:
    return await serve_completions(ctx_of(request), data, request)


async def _model_card(request: Request, name: str | None = None) -> ModelCard:
    """The served model's card, under ``name`` (one of its served names) if given."""
    ctx = ctx_of(request)
    engine = await until_disconnect(request, ctx.holder.wait_ready())
    served = ctx.model_name()
    return ModelCard(name or served, ctx.created, root=engine.model_name,
                     max_model_len=engine.max_model_len)


@get("/models", summary="The served model")
async def list_models(request: Request) -> ModelList:
    return ModelList([await _model_card(request)])


@get("/models/{model_id:path}", summary="One served model (OpenAI's model retrieve)")
async def retrieve_model(request: Request, model_id: FromPath[str]) -> ModelCard:
    name = model_id.lstrip("/")  # ids may hold a slash ("org/name")
    card = await _model_card(request, name)
    check_model(name or "/", ctx_of(request).served_names())
    return card


v1_router = Router("/v1", route_handlers=[chat_completions, completions, list_models,
                                          retrieve_model], guards=[require_api_key])


_HEALTH_MESSAGES = {
    "loading": "The model is loading; the server will be ready soon.",
    "warming": "The model is warming up; the server will be ready soon.",
    "asleep": "The engine is asleep; the next request wakes it.",
    "waking": "The engine is asleep and waking up for a request.",
    "draining": "The server is shutting down.",
}


@get("/health", summary="200 when the model is ready; 503 while it loads, sleeps or drains",
     responses={503: ResponseSpec(ErrorResponse)})
async def health(request: Request) -> Response:
    holder = ctx_of(request).holder
    state = holder.state
    if state == "ready":
        return Response({"status": "ok"}, status_code=200)
    if state == "failed":
        msg = f"The model failed to load: {holder.error}"
    else:
        msg = _HEALTH_MESSAGES[state]
    code = f"model_{state}" if state in ("loading", "failed") else state
    raise OpenAIError(503, msg, code=code, headers={"Retry-After": str(holder.retry_after)})


@get("/ping", summary="RunPod / SageMaker: 200 ready (or asleep), 204 initialising, 503 down",
     status_code=200)
async def ping(request: Request) -> Response:
    """RunPod's load balancer reads 204 as initialising and 200 as healthy; SageMaker wants
    200 when the container can take requests, which a sleeping engine can (it wakes)."""
    state = ctx_of(request).holder.state
    if state in ("ready", "asleep", "waking"):
        return Response({"status": "healthy", "state": state}, status_code=200)
    if state in ("loading", "warming"):
        return Response(b"", status_code=204)
    return Response({"status": "unhealthy", "state": state}, status_code=503)


@post("/sleep", status_code=200, guards=[require_api_key],
      summary="Free the accelerator: level 1 keeps weights in host memory, 2 drops them",
      responses={409: ResponseSpec(ErrorResponse, description="Requests in flight")})
async def sleep(request: Request, level: Annotated[int | None, QueryParameter(name="level")] = None
                ) -> dict[str, Any]:
    holder = ctx_of(request).holder
    changed = await holder.sleep(level)
    return {"is_sleeping": True, "changed": changed}


@post("/wake_up", status_code=200, guards=[require_api_key], summary="Wake a sleeping engine")
async def wake_up(request: Request) -> dict[str, Any]:
    changed = await ctx_of(request).holder.wake_up()
    return {"is_sleeping": False, "changed": changed}


@get("/is_sleeping", guards=[require_api_key], summary="Whether the engine sleeps")
async def is_sleeping(request: Request) -> dict[str, Any]:
    return {"is_sleeping": ctx_of(request).holder.asleep}


@post("/invocations", status_code=200, guards=[require_api_key],
      responses={200: ResponseSpec(ChatCompletion), **_ERRORS},
      summary="SageMaker: an OpenAI chat (messages) or completions (prompt) body")
async def invocations(request: Request) -> Response:
    raw = await request.body()
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise bad_request(f"The body is not valid JSON: {exc}", None) from None
    if not isinstance(body, dict) or ("messages" in body) == ("prompt" in body):
        raise bad_request("The body needs either 'messages' (chat) or 'prompt' (completions).",
                          None)
    ctx = ctx_of(request)
    try:
        if "messages" in body:
            return await serve_chat(ctx, msgspec.convert(body, ChatCompletionRequest), request)
        return await serve_completions(ctx, msgspec.convert(body, CompletionRequest), request)
    except msgspec.ValidationError as exc:
        raise bad_request(f"Invalid body: {exc}", None) from None


@get("/version", summary="edge-llm version")
async def version() -> dict[str, str]:
    from edge_llm import __version__

    return {"version": __version__}


@get("/metrics", summary="Prometheus metrics (vLLM names)", media_type=CONTENT_TYPE)
async def metrics(request: Request) -> Response:
    return Response(ctx_of(request).metrics.render(), media_type=CONTENT_TYPE)


async def _tokenizer_engine(request: Request, model: str | None = None) -> ServingEngine:
    """The engine whose tokenizer answers: no wake-up needed (a sleeping engine keeps its
    tokenizer), but the model must have loaded. 404 for a model not served."""
    ctx = ctx_of(request)
    engine = ctx.holder.engine
    if engine is None:
        engine = await until_disconnect(request, ctx.holder.wait_ready())
    check_model(model, ctx.served_names())
    return engine


@post("/tokenize", status_code=200, guards=[require_api_key],
      responses={200: ResponseSpec(TokenizeResponse), **_ERRORS},
      summary="vLLM: token ids of a prompt, or of messages rendered by the chat template")
async def tokenize_route(data: TokenizeBody, request: Request) -> TokenizeResponse:
    ctx = ctx_of(request)
    return tokenize(data, await _tokenizer_engine(request, data.model), ctx.chat_template)


@post("/detokenize", status_code=200, guards=[require_api_key],
      responses={200: ResponseSpec(DetokenizeResponse), **_ERRORS},
      summary="vLLM: the text of token ids")
async def detokenize_route(data: DetokenizeBody, request: Request) -> DetokenizeResponse:
    return detokenize(data, await _tokenizer_engine(request, data.model))


@get("/tokenizer_info", guards=[require_api_key],
     summary="vLLM: the tokenizer's configuration, special tokens and chat template")
async def tokenizer_info_route(request: Request) -> dict[str, Any]:
    return tokenizer_info(await _tokenizer_engine(request), ctx_of(request).chat_template)


TOKENIZER_ROUTES = [tokenize_route, detokenize_route, tokenizer_info_route]


@cache
def _page() -> str:
    return (resources.files("edge_llm.server") / "static" / "index.html").read_text("utf-8")


@get("/", include_in_schema=False, media_type="text/html")
async def index() -> Response:
    return Response(_page(), media_type="text/html; charset=utf-8")


ROUTES = [v1_router, health, ping, version, metrics, index, *TOKENIZER_ROUTES]
SLEEP_ROUTES = [sleep, wake_up, is_sleeping]  # ServerConfig.enable_sleep_endpoints
SAGEMAKER_ROUTES = [invocations]
