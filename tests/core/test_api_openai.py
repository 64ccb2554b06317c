"""The llama-cpp-python-style Python API: OpenAI-shaped dicts and chunk iterators that agree
with `Model.complete`, `Model.chat`, tools and response_format, the context manager, and
`forge.load` in `dir(forge)`. The tiny llama-f32 model."""

from __future__ import annotations

import json

import jsonschema
import pytest

import forge
from forge.errors import UsageError

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}},
           "required": ["city"], "additionalProperties": False}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def model(golden_dir):
    with forge.load(str(golden_dir / "models" / "llama-f32.gguf"), backend="cpu_simd",
                    n_ctx=1024) as m:  # fmt: skip
        yield m


def test_create_completion_and_its_stream(model):
    want = model.complete("Once upon", max_tokens=6, temperature=0)
    got = model.create_completion("Once upon", max_tokens=6, temperature=0)
    assert got["object"] == "text_completion" and got["id"].startswith("cmpl-")
    assert got["model"] == "llama-f32"
    assert got["choices"] == [{"index": 0, "text": want.text, "logprobs": None,
                               "finish_reason": want.finish_reason}]  # fmt: skip
    assert got["usage"] == {"prompt_tokens": want.prompt_tokens, "completion_tokens": 6,
                            "total_tokens": want.prompt_tokens + 6}  # fmt: skip
    chunks = list(model.create_completion("Once upon", max_tokens=6, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == want.text
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_create_chat_completion_chat_and_streams_agree(model):
    want = model.complete(model.chat_prompt(HI), max_tokens=5, temperature=0)
    got = model.create_chat_completion(HI, max_tokens=5, temperature=0)
    assert got["object"] == "chat.completion"
    assert got["choices"][0]["message"] == {"role": "assistant", "content": want.text}
    assert got["usage"]["completion_tokens"] == len(want.tokens)
    chunks = list(model.create_chat_completion(HI, max_tokens=5, temperature=0, stream=True))
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == want.text
    assert chunks[-1]["choices"][0]["finish_reason"] == want.finish_reason
    assert model.chat(HI, max_tokens=5, temperature=0) == want.text
    assert "".join(model.chat(HI, max_tokens=5, temperature=0, stream=True)) == want.text


def test_tools_and_response_format(model):
    got = model.create_chat_completion(HI, tools=TOOLS, tool_choice="required", seed=1,
                                       max_tokens=200)  # fmt: skip
    choice = got["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
    chunks = list(model.create_chat_completion(HI, tools=TOOLS, tool_choice="required", seed=1,
                                               max_tokens=200, stream=True))  # fmt: skip
    (streamed,) = [t for c in chunks for t in c["choices"][0]["delta"].get("tool_calls", [])]
    assert streamed["index"] == 0 and streamed["function"] == call["function"]
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}
    text = model.chat(HI, response_format=fmt, max_tokens=200, seed=2)
    jsonschema.validate(json.loads(text), WEATHER)
    with pytest.raises(UsageError, match="cannot be combined"):
        model.chat(HI, tools=TOOLS, tool_choice="required", response_format=fmt)
    with pytest.raises(UsageError, match="response_format type"):
        model.chat(HI, response_format={"type": "yaml"})


def test_the_context_manager_closes_the_model(golden_dir, monkeypatch):
    closed = []
    with forge.load(str(golden_dir / "models" / "llama-f32.gguf"), backend="cpu_simd") as m:
        monkeypatch.setattr(m.runner, "close", lambda: closed.append(True))
        assert m.complete("x", max_tokens=1, temperature=0).completion_tokens == 1
    assert closed == [True]


def test_load_and_model_are_visible():
    assert {"load", "Model", "__version__"} <= set(dir(forge))
    assert forge.load is forge.api.load
