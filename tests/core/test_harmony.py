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
from forge.tokenizer.harmony import HarmonyStream, is_harmony, split_reply
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
    content, reasoning = split_reply(REPLY)
    assert (content, reasoning) == ("Hello! How can I help?", "The user greets; answer briefly.")
    stream, deltas = HarmonyStream(), []
    for at in range(0, len(REPLY), step):
        deltas += stream.push(REPLY[at : at + step])
    deltas += stream.finish()
    assert "".join(d.get("content", "") for d in deltas) == content
    assert "".join(d.get("reasoning_content", "") for d in deltas) == reasoning
    assert all(len(d) == 1 and "<|" not in next(iter(d.values())) for d in deltas)


@pytest.mark.parametrize(
    "text, content, reasoning",
    [
        ("no channels at all", "no channels at all", ""),
        ("<|channel|>final<|message|>only the answer", "only the answer", ""),
        # the rendered form: <|end|> is a control token, dropped from the decoded text
        ("<|channel|>analysis<|message|>hmm<|start|>assistant<|channel|>final<|message|>ok",
         "ok", "hmm"),
        ("<|channel|>analysis<|message|>cut off mid-thought <|", "", "cut off mid-thought <|"),
        ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}", "{}", ""),
    ],
)  # fmt: skip
def test_reply_shapes(text, content, reasoning):
    assert split_reply(text) == (content, reasoning)


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
