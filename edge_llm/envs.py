"""Every environment variable edge-llm reads, declared once: name, type, default, reason.

The serve flags are not here: each ``edge-llm serve --some-flag`` also reads
``EDGE_LLM_SOME_FLAG``, generated from ``SERVE_OPTIONS`` in flags.py. This module declares the
rest, in groups (``edge-llm --help`` lists them from ``REGISTRY``):

* ``user``: settings a deployment may need.
* ``debug``: ways to compare or bisect; nobody needs them to serve.
* ``foreign``: variables of other programs whose values change what edge-llm does.

Values are read lazily, on each ``get()``, so a test's ``monkeypatch.setenv`` takes effect at
once and nothing is read at import time. A read is one dict lookup (kernel launches read some):
the parsed value is kept beside the stored text it came from and parsed again only when that
changes. An empty value
means unset. A value the type does not accept is a ``ValueError`` naming the variable.

Usage::

    from edge_llm import envs

    if envs.KERNELS.get() == "torch": ...
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")

USER, DEBUG, FOREIGN = "user", "debug", "foreign"
GROUP_TITLES = {
    USER: "settings",
    DEBUG: "debugging and comparisons",
    FOREIGN: "other programs' variables that edge-llm reads",
}

_TRUE = ("1", "true", "on", "yes")  # how other programs spell "on" (parse_truthy)
_FALSE = ("0", "false", "off", "no")


# ``os.environ.get`` encodes the name and decodes the value in Python on every call, which is
# too slow for reads on every kernel launch; CPython's mapping keeps its items in ``_data``
# (encoded keys and values, updated by every ``os.environ`` write, monkeypatch's included), so a
# read there is one dict lookup. Other Pythons take the plain path.
_DATA: dict | None = getattr(os.environ, "_data", None)
_ENCODE: Callable[[str], object] | None = getattr(os.environ, "encodekey", None)
_FAST = isinstance(_DATA, dict) and _ENCODE is not None


class EnvVar(Generic[T]):
    """One declared variable. ``get()`` is its parsed value (the default's when unset)."""

    __slots__ = ("name", "parse", "default", "doc", "group", "kind", "_key", "_memo")

    def __init__(self, name: str, parse: Callable[[str], T], default: str | None, doc: str,
                 group: str, kind: str) -> None:
        self.name = name
        self.parse = parse
        self.default = default  # as text, parsed like a set value; None: the value is None
        self.doc = doc
        self.group = group
        self.kind = kind  # what values it takes, for --help
        self._key = _ENCODE(name) if _FAST else name
        # (the process environment's stored value it was parsed from, the value)
        self._memo: tuple[object, T] | None = None

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable's text, None when unset or empty."""
        value = (os.environ if environ is None else environ).get(self.name)
        return value if value else None

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        return self.raw(environ) is not None

    def get(self, environ: Mapping[str, str] | None = None) -> T:
        """The value now (``environ``: read that mapping instead of the process's)."""
        if environ is not None:
            return self._parse(self.raw(environ))
        stored = _DATA.get(self._key) if _FAST else os.environ.get(self.name)
        memo = self._memo
        if memo is not None and memo[0] == stored:
            return memo[1]
        value = self._parse(self.raw())
        self._memo = (stored, value)
        return value

    def _parse(self, text: str | None) -> T:
        text = self.default if text is None else text
        if text is None:
            return None  # type: ignore[return-value]
        try:
            return self.parse(text)
        except ValueError as exc:
            raise ValueError(f"{self.name} must be {self.kind}, got {text!r}.") from exc

    def __repr__(self) -> str:
        return f"EnvVar({self.name}={self.raw()!r}, default={self.default!r})"


REGISTRY: dict[str, EnvVar] = {}


def _declare(name: str, parse: Callable[[str], T], default: str | None, doc: str, group: str,
             kind: str) -> EnvVar[T]:
    if name in REGISTRY:
        raise RuntimeError(f"{name} is declared twice")
    var = EnvVar(name, parse, default, doc, group, kind)
    REGISTRY[name] = var
    return var


# ---- parsers -------------------------------------------------------------------------------


def parse_switch(text: str) -> bool:
    """``1`` or ``0``: anything else is an error, not a silent default."""
    value = text.strip()
    if value not in ("0", "1"):
        raise ValueError(text)
    return value == "1"


def parse_truthy(text: str) -> bool:
    """Another program's on/off variable, read as it reads it: on when 1, true, on or yes."""
    return text.strip().lower() in _TRUE


def _choice(*values: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        low = text.strip().lower()
        if low not in values:
            raise ValueError(text)
        return low

    return parse


def parse_path(text: str) -> Path:
    return Path(text).expanduser()


def _text(text: str) -> str:
    return text


SWITCH = "0 or 1"

# ---- user -----------------------------------------------------------------------------------

MODEL = _declare(
    "EDGE_LLM_MODEL", _text, None,
    "the model to serve when the command line names none (a folder or hub id; default: the "
    "demo model)", USER, "a folder or hub id")
CACHE_DIR = _declare(
    "EDGE_LLM_CACHE_DIR", parse_path, "~/.cache/edge-llm",
    "where the demo model, compiled kernels and start-up measurements are kept", USER, "a folder")
URL = _declare(
    "EDGE_LLM_URL", _text, None,
    "RunPod recipe: an edge-llm server the handler forwards jobs to, instead of one it starts",
    USER, "a URL")
PRELOAD = _declare(
    "EDGE_LLM_PRELOAD", parse_switch, "1",
    "RunPod recipe: load the model before taking jobs rather than on the first one",
    USER, SWITCH)
PROBE_CACHE = _declare(
    "EDGE_LLM_PROBE_CACHE", parse_switch, "1",
    "keep the start-up memory measurements per model and code version, so a second cold start "
    "skips them", USER, SWITCH)

# ---- debugging and comparisons -------------------------------------------------------------

KERNELS = _declare(
    "EDGE_LLM_KERNELS", _choice("triton", "torch"), "triton",
    "torch: run the plain-torch references on CUDA too, to compare the two paths end to end",
    DEBUG, "triton or torch")

# ---- other programs' variables ---------------------------------------------------------------

TRITON_INTERPRET = _declare(
    "TRITON_INTERPRET", parse_truthy, "0",
    "Triton runs kernels in its CPU interpreter: the W4A16 path keeps to what it supports",
    FOREIGN, "1, true, on or yes: on")
DISABLE_MMA_V3 = _declare(
    "DISABLE_MMA_V3", parse_truthy, "0",
    "Triton uses mma.sync on Hopper too: kernel configs are chosen for that dispatch",
    FOREIGN, "1, true, on or yes: on")
HF_HUB_OFFLINE = _declare(
    "HF_HUB_OFFLINE", lambda text: text.strip().lower() not in _FALSE, "0",
    "the Hugging Face hub client is offline: named in the error when a model cannot be fetched",
    FOREIGN, "any value; 0, false, off or no: online")
PYTORCH_CUDA_ALLOC_CONF = _declare(
    "PYTORCH_CUDA_ALLOC_CONF", _text, None,
    "the user configured the CUDA allocator: edge-llm leaves it alone (else it turns on "
    "expandable segments on CUDA; expandable_segments:False keeps torch's default)",
    FOREIGN, "torch's syntax")
PYTORCH_ALLOC_CONF = _declare(
    "PYTORCH_ALLOC_CONF", _text, None,
    "the same, under torch's newer name", FOREIGN, "torch's syntax")
OMP_WAIT_POLICY = _declare(
    "OMP_WAIT_POLICY", _text, None,
    "set to PASSIVE when edge_llm is imported, unless given: OpenMP threads spinning while they "
    "wait slow every small CPU op down as soon as another process wants the cores",
    FOREIGN, "OpenMP's syntax")
OMP_NUM_THREADS = _declare(
    "OMP_NUM_THREADS", _text, None,
    "when set, torch's CPU thread count is left as the user chose it; unset, edge-llm caps it "
    "at the CPUs the process may use (affinity mask, cgroup quota)", FOREIGN, "a count")
TRITON_CACHE_DIR = _declare(
    "TRITON_CACHE_DIR", parse_path, None,
    "compiled Triton kernels; edge-llm serve sets it under EDGE_LLM_CACHE_DIR unless given, so "
    "a second cold start compiles nothing", FOREIGN, "a folder")
TORCHINDUCTOR_CACHE_DIR = _declare(
    "TORCHINDUCTOR_CACHE_DIR", parse_path, None,
    "TorchInductor's cache, set like TRITON_CACHE_DIR", FOREIGN, "a folder")
SAGEMAKER_BIND_TO_PORT = _declare(
    "SAGEMAKER_BIND_TO_PORT", int, None,
    "set by SageMaker: turns on SageMaker mode (POST /invocations) and is the port to bind",
    FOREIGN, "a port")
SM_MODEL_DIR = _declare(
    "SM_MODEL_DIR", _text, None,
    "set by SageMaker: turns on SageMaker mode", FOREIGN, "a folder")
CUDA_VISIBLE_DEVICES = _declare(
    "CUDA_VISIBLE_DEVICES", _text, None,
    "the GPUs CUDA shows this process; the benchmarks set it empty for their CPU-only children "
    "(building a checkpoint beside a GPU measurement)", FOREIGN, "CUDA's syntax")
PYTHONDONTWRITEBYTECODE = _declare(
    "PYTHONDONTWRITEBYTECODE", _text, None,
    "Python writes no .pyc files: tools/mutate.py sets it for mutmut's runs, whose mutants "
    "share a source file's path", FOREIGN, "any value: on")
OUT = _declare(
    "OUT", parse_path, None,
    "set by the GPU machine that runs benchmarks/: where a script writes its results when "
    "--out is not given", FOREIGN, "a folder")


def declared(group: str | None = None) -> list[EnvVar]:
    """The declared variables, in declaration order; ``group``: only that group's."""
    return [v for v in REGISTRY.values() if group is None or v.group == group]


def set_default(var: EnvVar, value: str, environ: MutableMapping[str, str] | None = None) -> bool:
    """Set ``var`` to ``value`` unless it is set (the user's setting wins); returns whether it
    set it. For variables that other libraries read when they load."""
    environ = os.environ if environ is None else environ
    if var.is_set(environ):
        return False
    environ[var.name] = value
    return True


def child_environ(values: Mapping[EnvVar, str | None] | None = None,
                  extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: this process's, then ``extra`` (names as given,
    e.g. a benchmark's ``--env NAME=VALUE``), then the declared ``values`` (None: removed)."""
    env = {**os.environ, **(extra or {})}
    for var, value in (values or {}).items():
        if value is None:
            env.pop(var.name, None)
        else:
            env[var.name] = value
    return env


def edge_llm_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every ``EDGE_LLM_*`` variable that is set, declared here or generated from a serve flag,
    sorted by name (what may change a measurement that is cached across starts)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith("EDGE_LLM_")}


def check_all() -> None:
    """Read every declared variable once: a ValueError names the first bad value (``edge-llm
    serve`` checks at start-up rather than when a kernel first reads it)."""
    for var in REGISTRY.values():
        var.get()


def help_text() -> str:
    """The variables for ``edge-llm --help``, one line each, by group."""
    lines = ["environment variables (besides EDGE_LLM_<FLAG> for each serve flag):"]
    for group, title in GROUP_TITLES.items():
        lines.append(f"  {title}:")
        for var in declared(group):
            default = "unset" if var.default is None else var.default
            lines.append(f"    {var.name} ({var.kind}; default {default})")
            lines += textwrap.wrap(var.doc, 96, initial_indent=" " * 6,
                                   subsequent_indent=" " * 6)
    return "\n".join(lines)
