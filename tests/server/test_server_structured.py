"""response_format, tools and samplers over HTTP with the official `openai` client: a `forge
serve` subprocess on the tiny llama-f32 (random weights: only the grammar shapes the JSON), and
the default model in-process. Every reply is parsed and checked with jsonschema."""

from __future__ import annotations

import json
import re
import warnings

import httpx
import jsonschema
import pytest

openai = pytest.importorskip("openai")
from fastapi.testclient import TestClient  # noqa: E402

from tests.support.server import MODEL, Server  # noqa: E402

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}  # fmt: skip
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}  # fmt: skip
WEATHER_FN = {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}
TOOLS = [{"type": "function", "function": WEATHER_FN}]
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
DEFAULT = "gemma-3-270m-q4_k_m"  # the default model's id (its file name)
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(golden_dir, tmp_path_factory):
    srv = Server(golden_dir / "models" / f"{MODEL}.gguf", tmp_path_factory.mktemp("srv"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.mark.parametrize("seed", [1, 2])
def test_json_schema_reply_parses_and_matches(client, seed):
    chat = client.chat.completions.create(model=MODEL, messages=USER, seed=seed,
                                          response_format=FORMAT, max_tokens=300)  # fmt: skip
    assert chat.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(chat.choices[0].message.content), PERSON)
    stream = client.completions.create(model=MODEL, prompt="Person:", seed=seed, stream=True,
                                       max_tokens=300,
                                       extra_body={"response_format": FORMAT})  # fmt: skip
    jsonschema.validate(json.loads("".join(c.choices[0].text for c in stream)), PERSON)


def test_forced_tool_call_parses_and_streams(client):
    chat = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, seed=3,
                                          tool_choice="required", max_tokens=300)  # fmt: skip
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    chunks = list(client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS,
                                                 tool_choice="required", seed=3, stream=True,
                                                 max_tokens=300))  # fmt: skip
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [(t.index, t.function.name, t.function.arguments) for t in streamed] == [
        (0, "get_weather", call.function.arguments)]  # fmt: skip
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
          "schema": {"type": "bogus"}}}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"tools": [{"type": "retrieval"}]}, "tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": FORMAT},
         "response_format"),
        ({"samplers": "top_k;no_such_stage"}, None),
        ({"grammar": "root ::= ("}, "grammar"),
        ({"grammar": 'root ::= "a"', "json_schema": PERSON}, "json_schema"),
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_a_400(server, extra, param):
    body = {"model": MODEL, "messages": USER, "max_tokens": 2, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    if param is None:
        assert "no_such_stage" in err["message"]
    else:
        assert err["param"].startswith(param)


@pytest.mark.parametrize("seed", [4, 5])
def test_llama_server_grammar_and_json_schema_fields(server, seed):
    body = {"model": MODEL, "prompt": "Go:", "seed": seed, "max_tokens": 300,
            "grammar": 'root ::= ("up" | "down") " " [0-9]{1,3}'}  # fmt: skip
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert re.fullmatch(r"(up|down) [0-9]{1,3}", r.json()["choices"][0]["text"])
    body = {"model": MODEL, "messages": USER, "seed": seed, "max_tokens": 300,
            "json_schema": PERSON}  # fmt: skip
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), PERSON)


def test_samplers_choose_the_chain(server):
    """A chain of only temperature 0 (greedy through the stage) answers like greedy decoding."""
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 6, "temperature": 0}
    greedy = httpx.post(server.url + "/v1/completions", json=body, timeout=30).json()
    body = {**body, "temperature": 0.0, "samplers": ["top_k", "greedy"], "top_k": 1}
    chained = httpx.post(server.url + "/v1/completions", json=body, timeout=30).json()
    assert chained["choices"][0]["text"] == greedy["choices"][0]["text"]


@pytest.fixture(scope="module")
def default_client(default_model_path):
    from forge.api import load
    from forge.server import create_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load(default_model_path, backend="cpu_simd", n_ctx=1024)
    with TestClient(create_app(model)) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                            max_retries=0)  # fmt: skip


def test_default_model_calls_the_tool_with_the_city(default_client):
    chat = default_client.chat.completions.create(model=DEFAULT, messages=USER, tools=TOOLS,
                                                  temperature=0, max_tokens=80)  # fmt: skip
    (call,) = chat.choices[0].message.tool_calls
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER)
    assert call.function.name == "get_weather" and args["city"] == "Paris"


def test_default_model_json_object(default_client):
    prompt = ('Q: What is the capital of Italy?\nA: {"city": "Rome", "country": "Italy"}\n'
              "Q: What is the capital of France?\nA:")  # fmt: skip
    extra = {"response_format": {"type": "json_object"}}
    done = default_client.completions.create(model=DEFAULT, prompt=prompt, temperature=0,
                                             max_tokens=60, extra_body=extra)  # fmt: skip
    assert done.choices[0].finish_reason == "stop"
    assert json.loads(done.choices[0].text) == {"city": "Paris", "country": "France"}
