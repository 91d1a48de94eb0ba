"""Random JSON schemas (hypothesis, derandomized, one batch): every constrained output is JSON
that validates against its schema with ``jsonschema``. Nested objects, arrays, enums, bounded
numbers and required fields; one engine, one batched ``generate`` for all of them."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from edge_llm import LLM, SamplingParams
from edge_llm.sampling_params import StructuredOutputsParams
from tests.engine_fixtures import demo_dir, tiny_dir  # noqa: F401

NUM_SCHEMAS = 60
NAMES = st.sampled_from(["id", "name", "size", "tags", "kind", "ok", "x", "items"])


def _leaf() -> st.SearchStrategy[dict]:
    ints = st.tuples(st.integers(-50, 50), st.integers(0, 60)).map(
        lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]})
    nums = st.tuples(st.integers(-9, 9), st.integers(1, 9)).map(
        lambda t: {"type": "number", "minimum": t[0], "maximum": t[0] + t[1]})
    strs = st.tuples(st.integers(0, 3), st.integers(0, 6)).map(
        lambda t: {"type": "string", "minLength": t[0], "maxLength": t[0] + t[1]})
    enums = st.lists(st.sampled_from(["red", "green", "blue", "a b", "x-1"]), min_size=1,
                     max_size=3, unique=True).map(lambda v: {"enum": v})
    return st.one_of(ints, nums, strs, enums, st.just({"type": "boolean"}),
                     st.just({"type": "null"}))


def _compound(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    arrays = st.tuples(children, st.integers(1, 2), st.integers(0, 2)).map(
        lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]})

    return st.one_of(arrays, _objects(children))


@st.composite
def _objects(draw, children: st.SearchStrategy[dict]) -> dict:
    props = draw(st.dictionaries(NAMES, children, min_size=1, max_size=3))
    required = draw(st.lists(st.sampled_from(sorted(props)), unique=True))
    return {"type": "object", "properties": props, "required": sorted(required),
            "additionalProperties": False}


# a top-level object of up to three nested values
SCHEMAS = _objects(st.recursive(_leaf(), _compound, max_leaves=4))


@pytest.fixture(scope="module")
def llm(tiny_dir):  # noqa: F811
    return LLM(str(tiny_dir), device="cpu", max_num_batched_tokens=2048, max_num_seqs=64)


def _draw_schemas(n: int) -> list[dict]:
    """n distinct schemas from hypothesis (derandomized: the same ones every run)."""
    seen: dict[str, dict] = {}

    @settings(max_examples=4 * n, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(SCHEMAS)
    def collect(schema: dict) -> None:
        seen.setdefault(json.dumps(schema, sort_keys=True), schema)

    collect()
    assert len(seen) >= n, f"hypothesis drew only {len(seen)} distinct schemas"
    return list(seen.values())[-n:]  # the last ones: hypothesis starts with the simplest


def test_random_schemas_all_validate(llm):
    schemas = _draw_schemas(NUM_SCHEMAS)
    assert sum(json.dumps(s).count('"type": "object"') > 1 for s in schemas) >= 10  # nested
    prompts = [{"prompt_token_ids": [1, 100 + i, 200 + i, 300]} for i in range(len(schemas))]
    params = [SamplingParams(max_tokens=160, temperature=0.9, seed=i,
                             structured_outputs=StructuredOutputsParams(json=schema))
              for i, schema in enumerate(schemas)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    finished = 0
    for schema, out in zip(schemas, outs, strict=True):
        c = out.outputs[0]
        if c.finish_reason == "length":
            continue
        finished += 1
        jsonschema.validate(json.loads(c.text), schema)
    assert finished >= 50, f"only {finished} of {len(schemas)} outputs finished"
