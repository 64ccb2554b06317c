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


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = moe_model(tmp_path_factory.mktemp("srv") / "gpt-oss.gguf", "gpt-oss")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = forge.load(str(path), backend="cpu_simd", n_ctx=512)
    script = ScriptedReplies(model)
    script.expect(model.chat_prompt(MESSAGES), model.tokenize(REPLY, add_special=False))
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
