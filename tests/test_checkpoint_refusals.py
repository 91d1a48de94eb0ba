"""Hostile or broken model folders are refused before anything is loaded, by a message that
names the file and the value: shard paths that leave the folder, invalid or absurd
config.json values, a layer count the tensors cannot hold, missing tokenizer files."""

from __future__ import annotations

import json
import os
import time

import pytest
from safetensors.torch import save_file

from edge_llm.model.arch import InvalidConfigError
from edge_llm.model.loader import load_model
from edge_llm.model.prefetch import checkpoint_files as prefetch_files
from edge_llm.model.shards import CheckpointIndexError
from tests.helpers import save_hf_checkpoint, tiny_hf_model


@pytest.fixture(scope="module")
def tiny():
    return tiny_hf_model("LlamaForCausalLM", layers=2)


def _folder(tiny, tmp_path):
    return save_hf_checkpoint(tiny, tmp_path / "model")


def _index(path, weight_map: dict) -> None:
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _edit_config(path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("escape", ["../outside.safetensors", "../../../../etc/passwd",
                                    "/etc/passwd", "sub/../../outside.safetensors"])
def test_index_shard_outside_the_folder_is_refused(tiny, tmp_path, escape):
    path = _folder(tiny, tmp_path)
    # a real safetensors file outside the folder: refused for where it is, not what it is
    save_file({"x": tiny.model.embed_tokens.weight.detach().clone()},
              str(tmp_path / "outside.safetensors"))
    names = list(tiny.state_dict())
    _index(path, {names[0]: escape, **{n: "model.safetensors" for n in names[1:]}})
    with pytest.raises(CheckpointIndexError) as err:
        load_model(str(path), device="cpu", progress=False)
    msg = str(err.value)
    assert "model.safetensors.index.json" in msg and repr(escape) in msg and "outside" in msg
    assert prefetch_files(str(path)) == []  # the page-cache prefetch reads nothing either


def test_shard_linked_out_of_the_folder_is_refused(tiny, tmp_path):
    path = _folder(tiny, tmp_path)
    outside = tmp_path / "elsewhere.safetensors"
    os.replace(path / "model.safetensors", outside)
    (path / "model-00001-of-00001.safetensors").symlink_to(outside)
    _index(path, {n: "model-00001-of-00001.safetensors" for n in tiny.state_dict()})
    with pytest.raises(CheckpointIndexError, match="model-00001-of-00001.safetensors"):
        load_model(str(path), device="cpu", progress=False)


def test_index_that_is_not_json_is_named(tiny, tmp_path):
    path = _folder(tiny, tmp_path)
    (path / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(CheckpointIndexError, match="index.json: invalid JSON"):
        load_model(str(path), device="cpu", progress=False)


def test_invalid_config_json_names_the_file(tiny, tmp_path):
    path = _folder(tiny, tmp_path)
    (path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],')
    with pytest.raises(InvalidConfigError) as err:
        load_model(str(path), device="cpu", progress=False)
    assert str(path / "config.json") in str(err.value) and "invalid JSON" in str(err.value)


@pytest.mark.parametrize("key,value", [("max_position_embeddings", 4_000_000_000_000),
                                       ("max_position_embeddings", -1),
                                       ("hidden_size", "64"), ("num_hidden_layers", 0),
                                       ("vocab_size", None)])
def test_absurd_config_values_are_refused_by_name(tiny, tmp_path, key, value):
    path = _folder(tiny, tmp_path)
    _edit_config(path, **{key: value})
    began = time.perf_counter()
    with pytest.raises(InvalidConfigError) as err:
        load_model(str(path), device="cpu", progress=False)
    msg = str(err.value)
    assert str(path / "config.json") in msg and key in msg
    assert value is None or repr(value) in msg or str(value) in msg
    assert time.perf_counter() - began < 5, "refused only after work"


@pytest.mark.parametrize("layers", [3, 1000])
def test_layer_count_the_tensors_cannot_hold_is_refused_first(tiny, tmp_path, layers,
                                                               monkeypatch):
    path = _folder(tiny, tmp_path)
    _edit_config(path, num_hidden_layers=layers)
    import edge_llm.model.loader as loader

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were read before the refusal")

    monkeypatch.setattr(loader, "_load_weights", no_load)
    with pytest.raises(InvalidConfigError) as err:
        load_model(str(path), device="cpu", progress=False)
    msg = str(err.value)
    assert f"num_hidden_layers={layers}" in msg and "layers 0-1" in msg
    assert str(path / "config.json") in msg


def test_fewer_layers_in_config_than_tensors_is_refused(tiny, tmp_path):
    path = _folder(tiny, tmp_path)
    _edit_config(path, num_hidden_layers=1)
    with pytest.raises(InvalidConfigError, match="num_hidden_layers=1"):
        load_model(str(path), device="cpu", progress=False)


def test_folder_without_tokenizer_files_is_refused_before_the_weights(tiny, tmp_path,
                                                                      monkeypatch):
    from edge_llm.config import EngineConfig, ModelConfig
    from edge_llm.engine import llm_engine

    path = _folder(tiny, tmp_path)

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded before the refusal")

    monkeypatch.setattr(llm_engine, "load_model", no_load)
    with pytest.raises(ValueError) as err:
        llm_engine.LLMEngine(EngineConfig(model=ModelConfig(model=str(path), device="cpu")))
    assert str(path) in str(err.value) and "no tokenizer files" in str(err.value)
    assert "tokenizer.json" in str(err.value)
