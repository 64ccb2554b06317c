"""gpt-oss's harmony chat format: forge's fallback template, the reply split into its channels
(content and reasoning_content) whole or streamed, the tokenizer's harmony rules (llama.cpp's:
structural tokens rendered, <|end|> not ending the reply), and the Python API's chat reply."""

from __future__ import annotations

import io

import pytest
from gguf import GGUFValueType as V

import forge
from forge.cli.chat import final_channel
from forge.gguf import open_gguf
from forge.tokenizer import tokenizer_from_metadata
from forge.tokenizer.chat import render_chat, resolve_chat_template
from forge.tokenizer.harmony import HarmonyStream, is_harmony, parse_reply
from forge.tokenizer.template_info import template_source
from tests.support.gguf_factory import rewrite_gguf
from tests.support.moe_factory import moe_model
from tests.support.scripted import ScriptedReplies

REPLY = (
    "<|channel|>analysis<|message|>The user greets; answer briefly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>"
)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    path = moe_model(tmp_path_factory.mktemp("h") / "gpt-oss.gguf", "gpt-oss")
    return forge.load(str(path), backend="cpu_simd", n_ctx=256)


def test_fallback_template_renders_harmony(gpt_oss):
    template = resolve_chat_template(gpt_oss.tokenizer)
    assert is_harmony(template)
    assert template_source(gpt_oss.tokenizer) == (
        "forge's built-in harmony template (the file has none)")  # fmt: skip
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "2+2?"},
    ]
    text = render_chat(template, messages, reasoning_effort="high")
    assert text == (
        "<|start|>system<|message|>Reasoning: high\n\n# Valid channels: analysis, commentary, "
        "final. Channel must be included for every message.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"
        "<|start|>user<|message|>Hi<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello.<|end|>"
        "<|start|>user<|message|>2+2?<|end|><|start|>assistant"
    )
    ids = gpt_oss.chat_prompt(messages[1:2])
    tok = gpt_oss.tokenizer
    assert ids[0] == tok.token_id("<|start|>") and tok.token_id("<|end|>") in ids
    assert tok.decode(ids).endswith("<|message|>Hi<|start|>assistant")  # <|end|>: control


def test_a_template_in_the_file_is_used(tmp_path, gpt_oss):
    own = "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}" \
          "<|end|>{% endfor %}<|start|>assistant<|channel|>final<|message|>"  # fmt: skip
    path = rewrite_gguf(gpt_oss.path, tmp_path / "t.gguf",
                        set_kv=[("tokenizer.chat_template", own, V.STRING, None)])  # fmt: skip
    tok = tokenizer_from_metadata(open_gguf(path).metadata)
    assert resolve_chat_template(tok) == own and template_source(tok).startswith("the model's own")


def test_tokenizer_follows_llama_cpp_for_harmony(gpt_oss):
    tok = gpt_oss.tokenizer
    ends = {tok.token_text(i) for i in tok.eog_ids}
    assert {"<|return|>", "<|call|>"} <= ends and "<|end|>" not in ends
    ids = tok.encode(REPLY)
    assert tok.decode(ids) == REPLY.replace("<|end|>", "").replace("<|return|>", "")


@pytest.mark.parametrize("step", [1, 3, 7, len(REPLY)])
def test_reply_channels_whole_and_streamed(step):
    content, reasoning, calls = parse_reply(REPLY)
    assert calls == []
    assert (content, reasoning) == ("Hello! How can I help?", "The user greets; answer briefly.")
    stream, deltas = HarmonyStream(), []
    for at in range(0, len(REPLY), step):
        deltas += stream.push(REPLY[at : at + step])
    deltas += stream.finish()
    assert "".join(d.get("content", "") for d in deltas) == content
    assert "".join(d.get("reasoning_content", "") for d in deltas) == reasoning
    assert all(len(d) == 1 and "<|" not in next(iter(d.values())) for d in deltas)


@pytest.mark.parametrize(
    "text, content, reasoning, calls",
    [
        ("no channels at all", "no channels at all", "", []),
        ("<|channel|>final<|message|>only the answer", "only the answer", "", []),
        # the rendered form: <|end|> is a control token, dropped from the decoded text
        ("<|channel|>analysis<|message|>hmm<|start|>assistant<|channel|>final<|message|>ok",
         "ok", "hmm", []),
        ("<|channel|>analysis<|message|>cut off mid-thought <|", "", "cut off mid-thought <|",
         []),
        # tool calls: the recipient in the channel header or in the role; <|call|> (the last
        # token) is a control token too
        ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}", "", "",
         [("f", "{}")]),
        ("<|channel|>analysis<|message|>need weather<|start|>assistant to=functions.get_weather"
         '<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>', "", "need weather",
         [("get_weather", '{"city": "Oslo"}')]),
        ("<|channel|>commentary<|message|>Checking.<|start|>assistant<|channel|>commentary "
         "to=functions.a<|message|>{}<|start|>assistant<|channel|>commentary to=functions.b"
         "<|message|>[1]", "Checking.", "", [("a", "{}"), ("b", "[1]")]),
    ],
)  # fmt: skip
def test_reply_shapes(text, content, reasoning, calls):
    assert parse_reply(text) == (content, reasoning, calls)
    stream = HarmonyStream()  # streamed a character at a time: the same calls, no call text
    deltas = [d for c in text for d in stream.push(c)] + stream.finish()
    assert stream.calls == calls
    assert "".join(d.get("content", "") for d in deltas) == content


def test_chat_command_keeps_the_final_channel_and_shows_the_analysis():
    shown = io.StringIO()
    pieces = ["<|channel|>", "analysis", "<|message|>", "think", "<|start|>", "assistant",
              "<|channel|>", "final", "<|message|>", "4"]  # fmt: skip
    assert "".join(final_channel(iter(pieces), shown)) == "4"
    assert shown.getvalue() == "think"


def test_chat_completion_returns_reasoning_content(gpt_oss):
    messages = [{"role": "user", "content": "Hi"}]
    script = ScriptedReplies(gpt_oss)
    script.expect(gpt_oss.chat_prompt(messages), gpt_oss.tokenize(REPLY, add_special=False))
    reply = gpt_oss.create_chat_completion(messages, max_tokens=256, temperature=0)
    message = reply["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Hello! How can I help?",
                       "reasoning_content": "The user greets; answer briefly."}  # fmt: skip
    assert reply["choices"][0]["finish_reason"] == "stop"
    chunks = list(gpt_oss.create_chat_completion(messages, max_tokens=256, temperature=0,
                                                 stream=True))  # fmt: skip
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == message["content"]
    assert gpt_oss.chat(messages, max_tokens=256, temperature=0) == "Hello! How can I help?"


def test_python_api_returns_harmony_calls_as_tool_calls(tmp_path):
    """forge's OpenAI-style API (create_chat_completion) on a gpt-oss model: a call to an
    offered function comes back as tool_calls beside the analysis, whole and streamed; a call
    to a function not offered is not a call."""
    from forge.completions import create_chat_completion

    model = forge.load(str(moe_model(tmp_path / "g.gguf", "gpt-oss")), backend="cpu_simd",
                       n_ctx=512)  # fmt: skip
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    messages = [{"role": "user", "content": "Find x."}]
    reply = (
        "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>"
        'commentary to=functions.lookup <|constrain|>json<|message|>{"q": "x"}<|call|>'
    )
    script = ScriptedReplies(model)
    script.expect(
        model.chat_prompt(messages, tools=tools), model.tokenize(reply, add_special=False)
    )
    out = create_chat_completion(model, messages, tools=tools, max_tokens=300, temperature=0)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "Look it up."
    assert [c["function"] for c in choice["message"]["tool_calls"]] == [
        {"name": "lookup", "arguments": '{"q": "x"}'}]  # fmt: skip
    chunks = list(create_chat_completion(model, messages, tools=tools, max_tokens=300,
                                         temperature=0, stream=True))  # fmt: skip
    calls = [c for ch in chunks for c in ch["choices"][0]["delta"].get("tool_calls", [])]
    assert [c["function"]["name"] for c in calls] == ["lookup"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    other = [{"type": "function", "function": {"name": "other", "parameters": {}}}]
    from forge.toolcall import plan_tools

    plan = plan_tools(resolve_chat_template(model.tokenizer), messages, other)
    assert plan.style == "harmony" and plan.parse(reply)[1] == []
