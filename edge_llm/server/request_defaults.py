"""What a request gets for the fields it leaves out: the model's recommended sampling settings
(vLLM's ``--generation-config``) and a bound on the tokens of a reply sent without
``max_tokens`` (``--default-max-tokens``).

vLLM's semantics: ``auto`` reads the model folder's ``generation_config.json`` and takes
``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty`` and ``max_new_tokens``
from it (only those the file sets); ``vllm`` ignores the file (the engine's own defaults:
temperature 1, no top-p/top-k); any other value is a folder holding a
``generation_config.json`` (or that file itself). A field the request sends always wins.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_llm.config import DEFAULT_MAX_TOKENS
from edge_llm.sampling_params import SamplingParams

logger = logging.getLogger("edge_llm.server")

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class RequestDefaults:
    """``sampling``: SamplingParams fields for those a request omits. ``max_tokens``: the most
    tokens a chat reply sent without ``max_tokens`` generates (None: the rest of the context).
    ``max_tokens_source``: where that bound came from, for the start-up log."""

    sampling: Mapping[str, float | int] = field(default_factory=dict)
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    max_tokens_source: str = "built-in default"


def generation_config_file(spec: str, model_path: Path | None) -> Path | None:
    """The file ``--generation-config`` names (None: no file to read). ValueError when an
    explicit path does not exist."""
    if spec == "vllm":
        return None
    if spec == "auto":
        if model_path is None:
            return None
        path = Path(model_path) / GENERATION_CONFIG
        return path if path.is_file() else None
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / GENERATION_CONFIG
    if not path.is_file():
        raise ValueError(f"--generation-config {spec}: no {GENERATION_CONFIG} there (expected "
                         "auto, vllm, or a folder holding that file)")
    return path


def read_generation_config(path: Path) -> dict[str, Any]:
    """The defaults ``path`` sets: SAMPLING_KEYS and ``max_tokens`` (its ``max_new_tokens``).
    ValueError naming the file and key on a value that is not a number of the right kind."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read it as JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    out: dict[str, Any] = {}
    for key in (*SAMPLING_KEYS, "max_new_tokens"):
        value = raw.get(key)
        if value is None:
            continue
        integral = key in ("top_k", "max_new_tokens")
        if isinstance(value, bool) or not isinstance(value, int if integral else (int, float)):
            kind = "an integer" if integral else "a number"
            raise ValueError(f"{path}: {key} must be {kind}, got {value!r}")
        if key == "max_new_tokens":
            if value < 1:
                raise ValueError(f"{path}: max_new_tokens must be >= 1, got {value}")
            out["max_tokens"] = value
        else:
            out[key] = value
    return out


def resolve_request_defaults(spec: str, model_path: Path | None,
                             default_max_tokens: int | None) -> RequestDefaults:
    """Defaults for one served model. ``default_max_tokens``: the operator's flag (None: not
    given, so the file's ``max_new_tokens`` or DEFAULT_MAX_TOKENS; 0: no bound). Logs what
    applies. ValueError on a bad file."""
    path = generation_config_file(spec, model_path)
    found = read_generation_config(path) if path is not None else {}
    if default_max_tokens is not None:
        max_tokens, source = default_max_tokens or None, "--default-max-tokens"
    elif "max_tokens" in found:
        max_tokens, source = found["max_tokens"], f"max_new_tokens of {path}"
    else:
        max_tokens, source = DEFAULT_MAX_TOKENS, "--default-max-tokens default"
    sampling = {k: v for k, v in found.items() if k in SAMPLING_KEYS}
    try:  # refused here, naming the file, rather than in every request that omits them
        SamplingParams(**sampling)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    bound = (f"at most {max_tokens} tokens" if max_tokens else "up to the rest of the context")
    logger.info("Chat requests without max_tokens generate %s (%s)", bound, source)
    if sampling:
        logger.info("Default sampling settings for requests that leave them out, from %s: %s "
                    "(--generation-config vllm ignores them)", path,
                    ", ".join(f"{k}={v}" for k, v in sampling.items()))
    return RequestDefaults(sampling, max_tokens, source)
