"""OpenAI error objects for every failure, including Litestar's own (404, 405, 413, bad JSON).

Every response that is not a success has the body
``{"error": {"message": str, "type": str, "param": str | None, "code": str | None}}``.
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from .protocol import ErrorInfo, ErrorResponse

logger = logging.getLogger("edge_llm.server")

# OpenAI's error "type" per status; anything else 4xx is an invalid request
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",  # OpenAI's type for an unknown model or route
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}


class OpenAIError(Exception):
    """An error to send as an OpenAI error object with ``status``; ``headers`` go along."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        logged: bool = False,
    ) -> None:
        super().__init__(message)
        self.logged = logged  # already logged where it arose: handlers add no line
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        fallback = "invalid_request_error" if self.status < 500 else "server_error"
        kind = _TYPES.get(self.status, fallback)
        return ErrorResponse(ErrorInfo(self.message, kind, self.param, self.code))

    def response(self) -> Response:
        return Response(self.body(), status_code=self.status, headers=self.headers,
                        media_type="application/json")


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready (logged as 499)."""


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def param_from_value_error(message: str, known: tuple[str, ...]) -> str | None:
    """The request field a ``SamplingParams`` ValueError names: it starts with the field
    ("top_p must be...", "n=50 exceeds...")."""
    m = re.match(r"[A-Za-z_]+", message)
    return m.group(0) if m and m.group(0) in known else None


def _validation_error(exc: ValidationException) -> OpenAIError:
    """Litestar's msgspec decoding error -> 400 naming the field (``$.a.b`` -> ``a.b``)."""
    extra = exc.extra if isinstance(exc.extra, list) else []
    for item in extra:
        if not isinstance(item, dict):
            continue
        key, msg = item.get("key"), str(item.get("message", ""))
        if key == "data":  # the body itself: a required field missing, or not an object
            missing = re.search(r"missing required field `([^`]+)`", msg)
            if missing:
                return bad_request(f"Missing required field '{missing.group(1)}'.",
                                   missing.group(1))
            return bad_request("The request body must be a JSON object.", None)
        if key:
            return bad_request(f"Invalid value for '{key}': {msg}.", str(key))
        if msg:
            return bad_request(f"Invalid request body: {msg}.", None)
    return bad_request(str(exc.detail or "Invalid request body."), None)


def _from_http_exception(exc: HTTPException, request: Request[Any, Any, Any]) -> OpenAIError:
    status = exc.status_code
    if isinstance(exc, ValidationException):
        return _validation_error(exc)
    detail = str(exc.detail or "")
    if status == 404:
        detail = f"Not found: no route matches {request.url.path}."
    elif status == 405:
        detail = f"Method {request.method} is not allowed for {request.url.path}."
    elif status == 413:
        detail = "The request body is too large."
    elif status == 400 and not detail:
        detail = "Bad request."
    elif not detail:
        detail = HTTPStatus(status).phrase
    headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() == "allow"}
    return OpenAIError(status, detail, headers=headers)


def handle_exception(request: Request[Any, Any, Any], exc: Exception) -> Response:
    """Litestar exception handler for every exception class (registered for ``Exception``)."""
    if isinstance(exc, OpenAIError):
        return exc.response()
    if isinstance(exc, RecursionError):  # msgspec decoding a deeply nested body
        return bad_request("The request body is nested too deeply.").response()
    if isinstance(exc, ClientDisconnected):  # nobody reads this; the log line shows 499
        return OpenAIError(499, "The client closed the request.").response()
    if isinstance(exc, HTTPException):
        err = _from_http_exception(exc, request)
        if err.status >= 500:
            logger.error("HTTP %d on %s: %s", err.status, request.url.path, err.message)
        return err.response()
    logger.exception("Unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return OpenAIError(500, f"Internal server error: {type(exc).__name__}: {exc}").response()
