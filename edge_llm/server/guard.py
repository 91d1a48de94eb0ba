"""Cross-site and slow-client defences, as one ASGI wrapper in front of the app.

A browser page the operator visits can send requests to a server on localhost. Three checks,
each answered with an OpenAI error object before any route runs:

- **Host** (DNS rebinding, as Ollama fixed it): when bound to a loopback address, the ``Host``
  header must name a loopback host (``localhost``, ``*.localhost``, ``127.0.0.0/8``, ``::1``)
  or one of ``allowed_hosts``; else 403. A rebound page sends its own domain as Host.
- **Origin**: a POST (or other unsafe method) whose ``Origin`` is neither the server's own
  (same scheme-less host:port as Host) nor in ``allowed_origins`` gets 403. Browsers send
  Origin on every cross-origin POST, also on the "simple" ones that CORS never preflights.
- **Content-Type**: a request with a body must say ``application/json`` (or ``*+json``);
  anything else gets 415 (SageMaker's ``/invocations`` excepted). A page can send
  ``text/plain``, form or typeless (Blob) bodies without a preflight, never JSON.

Slow clients: the whole body must arrive within ``body_read_timeout`` seconds (else 408); the
header deadline is the HTTP protocol's (``slow_clients.py``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import time

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from .errors import OpenAIError
from .protocol import to_json

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# SageMaker's runtime forwards whatever ContentType its caller set (often none); the route
# parses the body as JSON itself, and only SageMaker (signed requests) reaches it
_ANY_CONTENT_TYPE = frozenset({"/invocations"})
_LOOPBACK_NAMES = ("localhost", "localhost.", "ip6-localhost", "ip6-loopback")


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address, no port) is a loopback name or address."""
    host = host.strip().lower().strip("[]")
    if host in _LOOPBACK_NAMES or host.endswith((".localhost", ".localhost.")):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_host(value: str) -> str:
    """The host part of a ``Host`` header or an origin's authority (no port, no brackets)."""
    value = value.strip()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") > 1:  # a bare IPv6 address
        return value
    return value.rpartition(":")[0] if ":" in value else value


def _authority(origin: str) -> str:
    """``http://a.b:8000`` -> ``a.b:8000`` (lower case); "" for ``null`` and the like."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    return rest.rstrip("/") if sep else ""


def _content_type_is_json(value: str) -> bool:
    mime = value.split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/")
                                          and mime.endswith("+json"))


class RequestGuard:
    """The checks above; ``bind_host`` is the address the server listens on."""

    def __init__(self, app: ASGIApp, *, bind_host: str, allowed_hosts: tuple[str, ...] = (),
                 allowed_origins: tuple[str, ...] = (), body_read_timeout: float = 60.0
                 ) -> None:
        self.app = app
        self.check_host = is_loopback_host(bind_host) and "*" not in allowed_hosts
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self.any_origin = "*" in allowed_origins
        self.allowed_origins = frozenset(_authority(o) for o in allowed_origins) - {""}
        self.body_read_timeout = body_read_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _send_error(send, refusal)
            return
        if _has_body(headers):
            receive = _deadline(receive, self.body_read_timeout)
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[bytes, str]) -> OpenAIError | None:
        host = headers.get(b"host", "")
        if self.check_host and host and not self._host_allowed(host):
            return OpenAIError(
                403, f"Host {host!r} is not allowed: this server listens on a loopback address "
                "and answers only requests addressed to localhost (a DNS-rebinding defence). "
                "Start it with --allowed-hosts to accept other names.", code="host_not_allowed")
        method = scope.get("method", "GET")
        origin = headers.get(b"origin")
        if origin is not None and method not in _SAFE_METHODS and not self._origin_allowed(
                origin, host):
            return OpenAIError(
                403, f"Origin {origin!r} is not allowed to call this server; start it with "
                "--allowed-origins to allow browser pages from other origins.",
                code="origin_not_allowed")
        if _has_body(headers) and scope.get("path") not in _ANY_CONTENT_TYPE \
                and not _content_type_is_json(headers.get(b"content-type", "")):
            given = headers.get(b"content-type") or "none"
            return OpenAIError(415, f"Unsupported Content-Type {given!r}: send the body as "
                               "JSON with 'Content-Type: application/json'.",
                               code="unsupported_media_type")
        return None

    def _host_allowed(self, host: str) -> bool:
        name = split_host(host)
        return is_loopback_host(name) or name.lower() in self.allowed_hosts \
            or host.lower() in self.allowed_hosts

    def _origin_allowed(self, origin: str, host: str) -> bool:
        authority = _authority(origin)
        if self.any_origin or authority in self.allowed_origins:
            return True
        return bool(authority) and authority == host.strip().lower()  # same origin


def _has_body(headers: dict[bytes, str]) -> bool:
    if b"transfer-encoding" in headers:
        return True
    length = headers.get(b"content-length", "0").strip()
    return length not in ("", "0")


def _deadline(receive: Receive, seconds: float) -> Receive:
    """``receive`` that raises a 408 once the body has taken more than ``seconds``."""
    deadline = time.monotonic() + seconds
    body_done = False

    async def timed() -> Message:
        nonlocal body_done
        if body_done:  # the disconnect watchers wait here as long as the response lasts
            return await receive()
        try:
            message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0))
        except asyncio.TimeoutError:
            raise OpenAIError(408, f"The request body did not arrive within {seconds:g} s.",
                              code="request_timeout") from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            body_done = True
        return message

    return timed


async def _send_error(send: Send, err: OpenAIError) -> None:
    body = to_json(err.body())
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
