"""The server's engine protocol (edge_llm/server/engine_api.py) stays honest: AsyncEngine
implements every member with the same parameters, and every member is one the server uses."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

from edge_llm.engine.async_engine import AsyncEngine
from edge_llm.server.engine_api import ServingEngine
from tests.test_server_fake_engine import FakeEngine

SERVER = Path(__file__).resolve().parents[1] / "edge_llm" / "server"


def _members(cls: type) -> dict[str, object]:
    return {name: value for name, value in vars(cls).items()
            if not name.startswith("_") or name == "__call__"}


def _params(fn: object) -> list[tuple[str, object]]:
    """Names and kinds (``*args`` / ``**kwargs`` by kind only: their names are not API)."""
    star = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [("*" if p.kind in star else p.name, p.kind)
            for p in inspect.signature(fn).parameters.values()]


def _check_implements(engine: object, skip: tuple[str, ...] = ()) -> None:
    cls = type(engine)
    for name, want in _members(ServingEngine).items():
        if name in skip:
            continue
        assert hasattr(engine, name), f"{cls.__name__} lacks {name}"
        if isinstance(want, property):
            continue  # an attribute or a property: either will do
        got = getattr(cls, name)
        assert callable(got), f"{cls.__name__}.{name} is not a method"
        assert _params(got) == _params(want), f"{cls.__name__}.{name}: {_params(got)}"
        assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(want), name


def test_async_engine_implements_the_protocol():
    core = SimpleNamespace(tokenizer=object(), model_name="m", max_model_len=8,
                           loaded=SimpleNamespace(path=Path("/m")), grammars=object())
    _check_implements(AsyncEngine(core))


def test_the_fake_engine_implements_it_but_sleep():
    _check_implements(FakeEngine(None, [[1]]), skip=("sleep", "wake_up"))


def test_every_member_is_used_by_the_server():
    used: set[str] = set()
    for path in SERVER.glob("*.py"):
        if path.name == "engine_api.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                used.add(node.attr)
    unused = set(_members(ServingEngine)) - used
    assert not unused, f"ServingEngine members the server never uses: {sorted(unused)}"
