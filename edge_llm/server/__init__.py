"""The OpenAI-compatible HTTP server (Litestar): ``create_app()`` builds it."""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
