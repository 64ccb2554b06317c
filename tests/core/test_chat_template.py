"""Chat templates: built-in fallbacks per model family, hand-written Jinja templates, errors."""

from __future__ import annotations

from datetime import datetime

import pytest

from forge.errors import ModelError, UsageError
from forge.gguf import open_gguf
from forge.tokenizer import render_chat, resolve_chat_template, tokenizer_from_metadata
from forge.tokenizer.chat import (
    CHATML_TEMPLATE,
    GEMMA_TEMPLATE,
    LLAMA3_TEMPLATE,
    PLAIN_TEMPLATE,
)

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "How are you?"},
]


@pytest.fixture(scope="module")
def default_tok(default_model_path):
    return tokenizer_from_metadata(open_gguf(default_model_path).metadata)


def test_default_model_gets_gemma_turns(default_tok):
    """The default GGUF ships no template: the Gemma turn format is chosen from its vocabulary."""
    assert default_tok.chat_template is None
    template = resolve_chat_template(default_tok)
    assert template is GEMMA_TEMPLATE
    text = render_chat(template, CONVERSATION, bos_token="<bos>")
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHello<end_of_turn>\n"
        "<start_of_turn>model\nHi there<end_of_turn>\n"
        "<start_of_turn>user\nHow are you?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    # the rendered prompt carries its own BOS: encode without adding another
    ids = default_tok.encode(text, add_special=False)
    assert ids[:3] == [2, 105, default_tok.token_id("user")]
    assert ids.count(105) == 4 and ids.count(106) == 3 and ids[-1] == 107


def test_no_generation_prompt(default_tok):
    text = render_chat(GEMMA_TEMPLATE, CONVERSATION[1:2], add_generation_prompt=False)
    assert text == "<start_of_turn>user\nHello<end_of_turn>\n"


def test_family_detection(golden_dir):
    qwen = tokenizer_from_metadata(open_gguf(golden_dir / "models/qwen2-q4_k.gguf").metadata)
    llama = tokenizer_from_metadata(open_gguf(golden_dir / "models/llama-f32.gguf").metadata)
    assert resolve_chat_template(qwen) is CHATML_TEMPLATE
    assert resolve_chat_template(llama) is PLAIN_TEMPLATE
    text = render_chat(CHATML_TEMPLATE, CONVERSATION[:2])
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = qwen.encode(text)
    assert ids.count(qwen.token_id("<|im_start|>")) == 3
    assert render_chat(PLAIN_TEMPLATE, CONVERSATION[1:2], bos_token="<s>") == (
        "<s>user: Hello\nassistant: "
    )


def test_llama3_builtin():
    text = render_chat(LLAMA3_TEMPLATE, CONVERSATION[1:2], bos_token="<|begin_of_text|>")
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_model_template_wins():
    class Tok:
        chat_template = "{{ messages[0]['content'] }}"

    assert resolve_chat_template(Tok()) == Tok.chat_template


# A hand-written template in the multi-line style real GGUF templates use: block tags on their own
# lines must leave no stray whitespace (trim_blocks/lstrip_blocks, as transformers renders them).
MULTILINE = """\
{%- if messages[0]['role'] == 'system' %}
    {%- set system = messages[0]['content'] %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system = 'You are helpful.' %}
{%- endif %}
[SYS]{{ system }}[/SYS]
{% for m in messages %}
    {% if m['role'] not in ['user', 'assistant'] %}
        {{ raise_exception('unexpected role ' + m['role']) }}
    {% endif %}
    {% if loop.index0 > 5 %}{% break %}{% endif %}
<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>
{% endfor %}
{% if add_generation_prompt %}<assistant>{% endif %}"""


def test_multiline_template():
    assert render_chat(MULTILINE, CONVERSATION) == (
        "[SYS]Be brief.[/SYS]\n<user>Hello</user>\n<assistant>Hi there</assistant>\n"
        "<user>How are you?</user>\n<assistant>"
    )
    assert render_chat(MULTILINE, CONVERSATION[1:2], add_generation_prompt=False) == (
        "[SYS]You are helpful.[/SYS]\n<user>Hello</user>\n"
    )


def test_raise_exception_becomes_model_error():
    with pytest.raises(ModelError, match="rejected the conversation: unexpected role tool"):
        render_chat(MULTILINE, [{"role": "tool", "content": "x"}])


def test_helpers_tojson_and_strftime_now():
    template = "{{ strftime_now('%Y') }}|{{ tools | tojson }}|{{ messages | length }}"
    tools = [{"name": "météo", "args": {"city": "Zürich"}}]
    text = render_chat(template, CONVERSATION, tools=tools)
    assert text == f"{datetime.now().year}|" + '[{"name": "météo", "args": {"city": "Zürich"}}]|4'


@pytest.mark.parametrize(("template", "message"), [
    ("{% for m in messages %}", "does not compile"),
    ("{{ messages[0]['content'] + 1 }}", "failed to render: TypeError"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "failed to render: SecurityError"),
    ("{% set _ = messages.append(1) %}", "failed to render: SecurityError"),
])  # fmt: skip
def test_template_errors(template, message):
    with pytest.raises(ModelError, match=message):
        render_chat(template, CONVERSATION)


@pytest.mark.parametrize("messages", [
    "hello", [{"content": "no role"}], ["not a dict"], [{"role": 3, "content": "x"}],
])  # fmt: skip
def test_bad_messages(messages):
    with pytest.raises(UsageError, match="messages"):
        render_chat(CHATML_TEMPLATE, messages)
