"""The chat endpoint on a gpt-oss model (harmony format): the final channel comes back as
``content`` and the analysis channel as ``reasoning_content``, whole or streamed, as llama-server
returns them. The tiny gpt-oss model says a scripted reply (tests/support/scripted.py)."""

from __future__ import annotations

import json
import warnings

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

import forge  # noqa: E402
from forge.config import ServerConfig  # noqa: E402
from forge.server import create_app  # noqa: E402
from tests.support.moe_factory import moe_model  # noqa: E402
from tests.support.scripted import ScriptedReplies  # noqa: E402

REASONING = "Two and two make four."
ANSWER = "4"
REPLY = (f"<|channel|>analysis<|message|>{REASONING}<|end|>"
         f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>")  # fmt: skip
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
CALL_REPLY = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
              "<|channel|>commentary to=functions.get_weather <|constrain|>json"
              '<|message|>{"city": "Oslo"}<|call|>')  # fmt: skip


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = moe_model(tmp_path_factory.mktemp("srv") / "gpt-oss.gguf", "gpt-oss")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = forge.load(str(path), backend="cpu_simd", n_ctx=512)
    script = ScriptedReplies(model)
    script.expect(model.chat_prompt(MESSAGES), model.tokenize(REPLY, add_special=False))
    script.expect(model.chat_prompt(MESSAGES, tools=TOOLS),
                  model.tokenize(CALL_REPLY, add_special=False))  # fmt: skip
    with TestClient(create_app(model, ServerConfig())) as c:
        yield c


def _body(**extra):
    return {"messages": MESSAGES, "max_tokens": 200, "temperature": 0, **extra}


def test_final_channel_is_content_and_analysis_is_reasoning(client):
    r = client.post("/v1/chat/completions", json=_body())
    assert r.status_code == 200
    choice = r.json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": ANSWER,
                                 "reasoning_content": REASONING}  # fmt: skip
    assert choice["finish_reason"] == "stop"


def test_streamed_reply_splits_the_channels(client):
    r = client.post("/v1/chat/completions", json=_body(stream=True))
    assert r.status_code == 200
    events = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: {")]  # fmt: skip
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == REASONING
    assert "".join(d.get("content", "") for d in deltas) == ANSWER
    assert not any("<|" in v for d in deltas for v in d.values() if isinstance(v, str))
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.fixture
def rendered(monkeypatch):
    """The chat template variables of every prompt the server renders."""
    from forge.server import service

    seen: list[dict] = []
    real = service.render_chat

    def spy(template, messages, **variables):
        seen.append(variables)
        return real(template, messages, **variables)

    monkeypatch.setattr(service, "render_chat", spy)
    return seen


@pytest.mark.parametrize("extra,effort", [({"reasoning_effort": "high"}, "high"),
                                          ({"chat_template_kwargs": {"reasoning_effort": "low"}},
                                           "low"),
                                          ({}, None)])  # fmt: skip
def test_reasoning_effort_reaches_the_harmony_system_message(client, rendered, extra, effort):
    """reasoning_effort (OpenAI's field) or chat_template_kwargs (vLLM's, llama-server's) set
    the template variable the harmony template writes as "Reasoning: ..." (medium without)."""
    from forge.tokenizer.chat import render_chat
    from forge.tokenizer.harmony import HARMONY_TEMPLATE

    r = client.post("/v1/chat/completions", json=_body(max_tokens=2, **extra))
    assert r.status_code == 200, r.text
    assert rendered[-1].get("reasoning_effort") == effort
    text = render_chat(HARMONY_TEMPLATE, MESSAGES, **rendered[-1])
    assert f"Reasoning: {effort or 'medium'}\n" in text


def test_template_variables_forge_sets_cannot_be_overridden(client):
    reserved = {"messages": [], "bos_token": "x"}
    r = client.post("/v1/chat/completions", json=_body(chat_template_kwargs=reserved))
    assert r.status_code == 400
    assert "bos_token, messages cannot be set through chat_template_kwargs" in r.text
    r = client.post("/v1/chat/completions", json=_body(reasoning_effort="extreme"))
    assert r.status_code == 400 and "reasoning_effort" in r.text


def test_a_call_to_an_offered_function_becomes_tool_calls(client):
    """The harmony call (a commentary message to functions.get_weather) comes back as OpenAI's
    tool_calls, its analysis as reasoning_content, whole and streamed."""
    r = client.post("/v1/chat/completions", json=_body(tools=TOOLS))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    message = choice["message"]
    assert message["content"] is None and message["reasoning_content"] == "Need the weather."
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert choice["finish_reason"] == "tool_calls"

    r = client.post("/v1/chat/completions", json=_body(tools=TOOLS, stream=True))
    events = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: {")]  # fmt: skip
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need the weather."
    assert not "".join(d.get("content", "") for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [c["function"]["name"] for c in calls] == ["get_weather"] and calls[0]["index"] == 0
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_the_fallback_template_offers_tools_and_replays_calls():
    """forge's harmony template (files without their own) writes the tools into the developer
    message and an earlier assistant call, and its result, in the format's call form."""
    from forge.tokenizer.chat import render_chat
    from forge.tokenizer.harmony import HARMONY_TEMPLATE

    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}  # fmt: skip
    history = [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "name": "get_weather", "content": "12 C"}]  # fmt: skip
    text = render_chat(HARMONY_TEMPLATE, history, tools=TOOLS)
    assert ("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n"
            "## functions\n\nnamespace functions {\n\n// Current weather of a city.\n"
            'type get_weather = (_: {"type": "object", "properties": {"city": {"type": '
            '"string"}}}) => any;\n\n} // namespace functions<|end|>') in text  # fmt: skip
    assert ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
            '<|message|>{"city": "Oslo"}<|call|><|start|>functions.get_weather to=assistant'
            "<|channel|>commentary<|message|>12 C<|end|><|start|>assistant") in text  # fmt: skip
    assert "# Tools" not in render_chat(HARMONY_TEMPLATE, MESSAGES)


def test_a_forced_tool_choice_is_refused_for_harmony(client):
    r = client.post("/v1/chat/completions", json=_body(tools=TOOLS, tool_choice="required"))
    assert r.status_code == 400 and "harmony" in r.json()["error"]["message"]
