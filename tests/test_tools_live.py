"""Tools and structured outputs against a real ``edge-llm serve`` on the demo model, through
the clients people use: the official ``openai`` client (parse, streams and their
accumulator), the OpenAI Agents SDK and LangChain."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 16}},
                   "required": ["tz"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
FAST = dict(max_tokens=48, temperature=0)


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false, as strict needs
    name: str = Field(max_length=12)
    country: str = Field(max_length=12)
    population: int = Field(ge=0, le=10**9)


@pytest.fixture(scope="module")
def client(live_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def _args_valid(call, tool) -> dict:
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


# ---- structured outputs --------------------------------------------------------------------
def test_parse_with_a_pydantic_model(client, model):
    r = client.chat.completions.parse(model=model, response_format=City, max_tokens=60,
                                      temperature=0, messages=[
                                          {"role": "user", "content": "Describe Paris."}])
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)
    City.model_validate_json(choice.message.content)


def test_streamed_json_schema_is_the_same_json(client, model):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "strict": True,
                                                  "schema": City.model_json_schema()}}
    # the first request of a prompt prefills it whole, later ones from the prefix cache:
    # other shapes, other roundings, and a near-tie (a digit of the population) may go either
    # way. The two compared here both start from the cache.
    client.chat.completions.create(model=model, messages=ASK, response_format=fmt,
                                   max_tokens=1, temperature=0)
    whole = client.chat.completions.create(model=model, messages=ASK, response_format=fmt,
                                           max_tokens=60, temperature=0)
    stream = client.chat.completions.create(model=model, messages=ASK, response_format=fmt,
                                            max_tokens=60, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "stop"
    City.model_validate_json(text)


@pytest.mark.parametrize("extra,check", [
    ({"response_format": {"type": "json_object"}}, lambda t: isinstance(json.loads(t), dict)),
    ({"guided_choice": ["sunny", "rainy"]}, lambda t: t in ("sunny", "rainy")),
    ({"guided_regex": r"[0-9]{2} degrees"}, lambda t: t.endswith(" degrees") and t[:2].isdigit()),
    # bounded items: an unbounded integer lets a sampled reply run digits to max_tokens
    ({"guided_json": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                 "maximum": 9}, "minItems": 2, "maxItems": 4}},
     lambda t: 2 <= len(json.loads(t)) <= 4 and all(0 <= v <= 9 for v in json.loads(t))),
    ({"guided_grammar": 'start: "It is " ("hot" | "cold")'}, lambda t: t in ("It is hot",
                                                                             "It is cold")),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda t: t in ("yes", "no")),
    ({"json_schema": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                      "required": ["ok"]}}, lambda t: isinstance(json.loads(t)["ok"], bool)),
    ({"grammar": 'root ::= "A" | "B"'}, lambda t: t in ("A", "B")),
])
def test_every_constraint_field_is_honoured(client, model, extra, check):
    r = client.chat.completions.create(model=model, messages=ASK, max_tokens=60,
                                       temperature=0.7, seed=1, extra_body=extra)
    assert r.choices[0].finish_reason == "stop"
    assert check(r.choices[0].message.content), r.choices[0].message.content


def test_completions_endpoint_honours_constraints_for_every_choice(client, model):
    r = client.completions.create(model=model, prompt=["Lucky number:", "Code:"], n=2,
                                  max_tokens=12, temperature=1.0, seed=3,
                                  extra_body={"guided_regex": "[0-9]{4}"})
    assert len(r.choices) == 4
    assert all(len(c.text) == 4 and c.text.isdigit() for c in r.choices)


@pytest.mark.parametrize("body,param,needle", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"not": {"type": "string"}}}}}, "response_format", '"not"'),
    ({"guided_json": {"type": "object", "dependentRequired": {"a": ["b"]}}}, "guided_json",
     "dependentRequired"),
    ({"guided_regex": "a(?=b)"}, "guided_regex", "look-around"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex",
     "Only one"),
    ({"tools": [WEATHER], "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "response_format", "tool_choice"),
    ({"mirostat": 2, "typical_p": 0.5}, "mirostat", "typical_p"),
    ({"use_beam_search": True}, "use_beam_search", "use_beam_search"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}},
      "tools": [WEATHER]}, "tool_choice", "nope"),
])
def test_refusals_are_400s_naming_the_field_and_keyword(live_server, model, body, param,
                                                         needle):
    r = httpx.post(live_server.url + "/v1/chat/completions", timeout=30,
                   json={"model": model, "messages": ASK, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"], err


# ---- tools ---------------------------------------------------------------------------------
@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
def test_forced_tool_calls_validate_whole_and_streamed(client, model, choice):
    r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice=choice, parallel_tool_calls=False, **FAST)
    (c,) = r.choices
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    if isinstance(choice, dict):
        assert call.function.name == "get_weather"
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    args = _args_valid(call, tool)
    with client.chat.completions.stream(model=model, messages=ASK, tools=[WEATHER, TIME],
                                        tool_choice=choice, parallel_tool_calls=False,
                                        **FAST) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in events
    (sc,) = final.choices
    assert sc.finish_reason == "tool_calls"
    (scall,) = sc.message.tool_calls
    assert scall.function.name == call.function.name
    assert json.loads(scall.function.arguments) == args  # greedy: the same call


def test_tool_results_second_turn(client, model):
    first = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER],
                                           tool_choice="required", **FAST)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id,
                      "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    for choice in ("auto", "none"):
        r = client.chat.completions.create(model=model, messages=history, tools=[WEATHER],
                                           tool_choice=choice, max_tokens=8, temperature=0)
        assert r.choices[0].message.content and r.choices[0].message.tool_calls is None
        assert r.usage.prompt_tokens > first.usage.prompt_tokens + 10  # the calls rendered


def test_n_choices_each_call_a_tool(client, model):
    r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice="required", n=3, max_tokens=48,
                                       temperature=1.0, seed=5)
    assert len(r.choices) == 3
    for c in r.choices:
        assert c.finish_reason == "tool_calls"
        for call in c.message.tool_calls:
            _args_valid(call, {"get_weather": WEATHER, "get_time": TIME}[call.function.name])


def test_many_tools_with_auto_on_a_model_without_a_tool_format_answer_plainly(client, model):
    """Open WebUI attaches its built-in tools to every chat: the demo (no tool format in its
    template) answers with plain content, streaming and not, never a 400."""
    tools = [{"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Built-in tool {i}.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
        for i in range(36)]
    msgs = [{"role": "user", "content": "Say hello."}]
    r = client.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=8,
                                       temperature=0)
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
    stream = client.chat.completions.create(model=model, messages=msgs, tools=tools,
                                            stream=True, max_tokens=8, temperature=0)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == r.choices[0].message.content


# ---- agent frameworks ----------------------------------------------------------------------
def test_openai_agents_sdk_runs_an_agent_with_a_function_tool(live_server, model):
    agents = pytest.importorskip("agents")
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        return f"{city}: 21 C, clear sky"

    async def run() -> object:
        oa = openai.AsyncOpenAI(base_url=live_server.url + "/v1", api_key="unused",
                                max_retries=0)
        agent = agents.Agent(
            name="weather", instructions="Answer with the weather tool.",
            tools=[get_weather],
            model=agents.OpenAIChatCompletionsModel(model=model, openai_client=oa),
            model_settings=agents.ModelSettings(tool_choice="required", max_tokens=24,
                                                temperature=0))
        return await agents.Runner.run(agent, "Weather in Paris?", max_turns=4)

    agents.set_tracing_disabled(True)
    result = asyncio.run(run())
    assert len(calls) == 1 and isinstance(calls[0], str) and calls[0]
    assert isinstance(result.final_output, str) and result.final_output


def test_langchain_bind_tools_and_structured_output(live_server, model):
    lc = pytest.importorskip("langchain_openai")
    llm = lc.ChatOpenAI(base_url=live_server.url + "/v1", api_key="unused", model=model,
                        max_tokens=60, temperature=0, max_retries=0)
    msg = llm.bind_tools([WEATHER], tool_choice="get_weather").invoke("Weather in Rome?")
    (call,) = msg.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], WEATHER["function"]["parameters"])
    city = llm.with_structured_output(City).invoke("Describe Rome.")
    assert isinstance(city, City)
    city = llm.with_structured_output(City, method="function_calling").invoke("Describe Oslo.")
    assert isinstance(city, City)
