"""``edge-llm chat``: a terminal chat over the HTTP API (the ``openai`` client), with history.

With ``--url`` it talks to a running server; otherwise it starts the app in this process on a
free local port (the engine loads in the background as in ``serve``) and talks to that.
Commands: ``/exit`` (or EOF, Ctrl-D) quits, ``/reset`` clears the history.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, TextIO

HELP = "Commands: /reset clears the history, /exit quits (or Ctrl-D)."


@dataclass(frozen=True)
class ChatSettings:
    api_key: str | None = None
    system: str | None = None
    temperature: float = 0.7
    max_tokens: int = 512


def base_url(url: str) -> str:
    """``http://host:port`` or ``.../v1`` -> the ``/v1`` base URL the openai client wants."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def chat_with_url(url: str, settings: ChatSettings, stdin: TextIO | None = None,
                  stdout: TextIO | None = None) -> int:
    import openai

    client = openai.OpenAI(base_url=base_url(url), api_key=settings.api_key or "none",
                           max_retries=0, timeout=600.0)
    try:
        model = client.models.list().data[0].id
    except openai.APIError as exc:
        print(f"edge-llm chat: error: cannot reach {url}: {_describe(exc)}", file=sys.stderr)
        return 1
    return repl(client, model, settings, stdin or sys.stdin, stdout or sys.stdout)


def repl(client: Any, model: str, settings: ChatSettings, stdin: TextIO, stdout: TextIO) -> int:
    """Read lines, stream replies; returns 0 at /exit or EOF."""
    base = [{"role": "system", "content": settings.system}] if settings.system else []
    history = list(base)
    print(f"Chatting with {model}. {HELP}", file=stdout, flush=True)
    while True:
        line = _read_line(stdin, stdout)
        if line is None:  # EOF
            print(file=stdout, flush=True)
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/exit":
            return 0
        if text == "/reset":
            history = list(base)
            print("(history cleared)", file=stdout, flush=True)
            continue
        if text.startswith("/"):
            print(f"Unknown command {text!r}. {HELP}", file=stdout, flush=True)
            continue
        history.append({"role": "user", "content": text})
        reply = _stream_reply(client, model, history, settings, stdout)
        if reply is None:
            history.pop()  # the turn failed: do not keep half of it
        else:
            history.append({"role": "assistant", "content": reply})


def _read_line(stdin: TextIO, stdout: TextIO) -> str | None:
    if stdin is sys.stdin and stdout is sys.stdout and stdin.isatty():
        try:
            import readline  # noqa: F401 - line editing and history for input()
        except ImportError:
            pass
        try:
            return input("> ")
        except EOFError:
            return None
    print("> ", end="", file=stdout, flush=True)
    line = stdin.readline()
    return line or None


def _stream_reply(client: Any, model: str, history: list[dict], settings: ChatSettings,
                  stdout: TextIO) -> str | None:
    import openai

    parts: list[str] = []
    try:
        stream = client.chat.completions.create(
            model=model, messages=history, stream=True, temperature=settings.temperature,
            max_tokens=settings.max_tokens,
        )
        try:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
                    print(parts[-1], end="", file=stdout, flush=True)
        except KeyboardInterrupt:  # stop this reply, keep the chat
            stream.close()
    except openai.APIError as exc:
        print(f"\n[error] {_describe(exc)}", file=stdout, flush=True)
        return None
    print(file=stdout, flush=True)
    return "".join(parts)


def _describe(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message"))
    if isinstance(body, dict) and "message" in body:
        return str(body["message"])
    return str(exc)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ThreadedServer:
    """uvicorn running an app in a daemon thread (for the in-process chat)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None) -> None:
        import uvicorn

        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(app, host=host, port=self.port, log_level="warning",
                                access_log=False, log_config=None)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="edge-llm-chat-server",
                                       daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the in-process server did not start on {self.url}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def wait_ready(url: str, timeout: float, stream: TextIO) -> str | None:
    """Poll ``/health`` until 200; returns None, or the error message if loading failed."""
    import httpx

    print("Loading the model...", file=stream, flush=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url + "/health", timeout=5)
        except httpx.HTTPError:
            time.sleep(0.2)
            continue
        if r.status_code == 200:
            return None
        error = r.json().get("error", {}) if r.headers.get("content-type", "").startswith(
            "application/json") else {}
        if error.get("code") == "model_failed":
            return str(error.get("message"))
        time.sleep(0.2)
    return f"the model did not load within {timeout:g} s"


def chat_in_process(model: str | None, settings: ChatSettings, *,
                    max_model_len: int | None = None, device: str = "auto",
                    load_timeout: float = 1800.0) -> int:
    from edge_llm.config import EngineConfig, ModelConfig, ServerConfig

    from .app import create_app

    engine_cfg = EngineConfig(model=ModelConfig(model=model, max_model_len=max_model_len,
                                                device=device))
    app = create_app(engine_cfg, ServerConfig(log_requests=False, api_key=None))
    server = ThreadedServer(app)
    server.start()
    try:
        error = wait_ready(server.url, load_timeout, sys.stderr)
        if error is not None:
            print(f"edge-llm chat: error: {error}", file=sys.stderr)
            return 1
        return chat_with_url(server.url, ChatSettings(
            api_key=None, system=settings.system, temperature=settings.temperature,
            max_tokens=settings.max_tokens))
    finally:
        server.stop()
