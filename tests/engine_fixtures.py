"""Fixtures for engine tests: the demo model and tiny random models sharing its tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import save_hf_checkpoint, tiny_hf_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json")


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    from edge_llm.model.demo import ensure_demo_model

    return ensure_demo_model()


def make_tiny_model(demo: Path, out: Path, arch: str = "LlamaForCausalLM", **kw) -> Path:
    """A random model with the demo model's 49,152-token vocabulary and tokenizer."""
    hf = tiny_hf_model(arch, vocab=49152, **kw)
    save_hf_checkpoint(hf, out)
    for name in TOKENIZER_FILES:
        if (demo / name).is_file():
            shutil.copy(demo / name, out / name)
    return out


@pytest.fixture(scope="session")
def tiny_dir(demo_dir, tmp_path_factory) -> Path:
    return make_tiny_model(demo_dir, tmp_path_factory.mktemp("tiny"), layers=2, hidden=64)
