"""Tool calling: styles chosen from the template, prompts rendered with the tools, replies parsed
into calls; under a forcing tool_choice every sampled reply (random logits: only the grammar
shapes it) parses into calls whose arguments match the tool's schema (jsonschema)."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from forge.errors import UsageError
from forge.generation import SequenceState
from forge.gguf import open_gguf
from forge.sampling import SamplingParams, build_sampler
from forge.tokenizer import render_chat, tokenizer_from_metadata
from forge.tokenizer.chat import GEMMA_TEMPLATE
from forge.toolcall import plan_tools

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 10},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}}},
]  # fmt: skip
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
# A small template in the Hermes style (Qwen 2.5): tools listed in the system turn, calls as
# <tool_call> blocks.
HERMES = (
    "{%- if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n"
    '{% endfor %}Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call>'
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA_JSON = "{% for m in messages %}{{ m.content }}{% endfor %}{{ tools | tojson }}"
USER = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.fixture(scope="module")
def tokenizer(golden_dir):
    """A byte-level BPE vocabulary (qwen2, 469 tokens): every byte can be spelled."""
    return tokenizer_from_metadata(
        open_gguf(str(golden_dir / "models" / "qwen2-q4_k.gguf")).metadata
    )


def sample_reply(tokenizer, constraint: dict, seed: int) -> str:
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed,
                            constraint=constraint)  # fmt: skip
    state = SequenceState([0], tokenizer, build_sampler(params, tokens=[0], tokenizer=tokenizer),
                          max_tokens=600, n_ctx=4096)  # fmt: skip
    rng = np.random.default_rng(seed)
    while not state.finished:
        state.step(rng.normal(0, 3, tokenizer.n_vocab).astype(np.float32))
    assert state.finish_reason == "stop", state.text
    return state.text


def check_calls(calls, names=SCHEMAS) -> None:
    assert calls
    for call in calls:
        assert call.name in names and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


@pytest.mark.parametrize("template, style", [(HERMES, "hermes"), (LLAMA_JSON, "json"),
                                             (GEMMA_TEMPLATE, "generic")])  # fmt: skip
@pytest.mark.parametrize("seed", range(3))
def test_forced_replies_always_parse_into_valid_calls(tokenizer, template, style, seed):
    plan = plan_tools(template, USER, TOOLS, "required")
    assert plan.style == style and plan.constraint is not None
    content, calls = plan.parse(sample_reply(tokenizer, plan.constraint, seed))
    check_calls(calls)
    assert content is None


@pytest.mark.parametrize("seed", range(3))
def test_a_named_tool_choice_allows_only_that_tool(tokenizer, seed):
    choice = {"type": "function", "function": {"name": "get_time"}}
    for template in (HERMES, GEMMA_TEMPLATE):
        plan = plan_tools(template, USER, TOOLS, choice)
        _, calls = plan.parse(sample_reply(tokenizer, plan.constraint, seed))
        check_calls(calls, names={"get_time"})


def test_generic_auto_lets_the_model_answer_in_text(tokenizer):
    plan = plan_tools(GEMMA_TEMPLATE, USER, TOOLS, "auto")
    assert plan.parse('{"content": "It is sunny."}') == ("It is sunny.", [])
    content, calls = plan.parse(
        '{"tool_calls": [{"name": "get_time", "arguments": {"zone": "UTC"}}]}'
    )
    assert content is None and calls[0].name == "get_time" and json.loads(calls[0].arguments) == {
        "zone": "UTC"}  # fmt: skip
    assert plan.parse("not json") == ("not json", [])


def test_native_templates_render_the_tools_and_parse_their_formats():
    plan = plan_tools(HERMES, USER, TOOLS, "auto")
    assert plan.constraint is None  # auto on a native template: the model writes freely
    text = render_chat(HERMES, plan.messages, **plan.template_vars)
    assert '"name": "get_weather"' in text and text.endswith("<|im_start|>assistant\n")
    reply = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
             '{"city": "Oslo", "unit": "celsius"}}\n</tool_call>')  # fmt: skip
    content, calls = plan.parse(reply)
    assert content == "Let me check." and [c.name for c in calls] == ["get_weather"]
    assert plan.parse("Just text") == ("Just text", [])
    llama = plan_tools(LLAMA_JSON, USER, TOOLS, "auto")
    reply = '<|python_tag|>{"name": "get_time", "parameters": {"zone": "CET"}}'
    assert [(c.name, json.loads(c.arguments)) for c in llama.parse(reply)[1]] == [
        ("get_time", {"zone": "CET"})]  # fmt: skip
    assert llama.parse('{"name": "rm_rf", "parameters": {}}')[1] == []  # not offered


def test_generic_prompt_describes_tools_and_replays_history():
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees"},
    ]  # fmt: skip
    plan = plan_tools(GEMMA_TEMPLATE, history, TOOLS, "auto")
    text = render_chat(GEMMA_TEMPLATE, plan.messages, **plan.template_vars)
    assert "get_weather" in text and "Weather now" in text
    assert '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}' in text
    assert "Tool result (call_1): 4 degrees" in text


def test_no_tools_or_none_means_no_plan():
    assert plan_tools(HERMES, USER, None) is None
    assert plan_tools(HERMES, USER, TOOLS, "none") is None


@pytest.mark.parametrize(
    "tools, choice, words",
    [
        ([], "auto", "non-empty list"),
        ([{"type": "retrieval"}], "auto", "tools[0] must be"),
        ([{"type": "function", "function": {"name": "a b"}}], "auto", "tools[0].function.name"),
        ([TOOLS[0], TOOLS[0]], "auto", "offered twice"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, "not among the tools"),
        (TOOLS, "sometimes", "tool_choice must be"),
    ],
)
def test_bad_tools_are_usage_errors(tools, choice, words):
    with pytest.raises(UsageError, match=re.escape(words)):
        plan_tools(HERMES, USER, tools, choice)


def stream_all(plan, text: str, sizes) -> tuple[list[str], list[dict], str]:
    """Feed `text` in chunks of the given sizes: (content deltas while streaming, the final
    deltas, the finish reason)."""
    from forge.toolcall_stream import ReplyStream

    reply, streamed, at = ReplyStream(plan), [], 0
    for n in sizes:
        streamed += [d["content"] for d in reply.push(text[at : at + n])]
        at += n
    streamed += [d["content"] for d in reply.push(text[at:])]
    final, reason = reply.finish("stop")
    return streamed, final, reason


@pytest.mark.parametrize("seed", range(4))
def test_generic_content_streams_as_it_comes(seed):
    """Any string, escaped as json.dumps writes it (ASCII-only or not), arrives through the
    stream deltas exactly, in more than one piece, before the reply is complete."""
    rng = np.random.default_rng(seed)
    alphabet = list('ab "\\/\n\t\u00e9\u4e2d\U0001f600\x01') + ["xyz"]
    text = "".join(rng.choice(alphabet, 40))
    reply = json.dumps({"content": text}, ensure_ascii=bool(seed % 2))
    plan = plan_tools(GEMMA_TEMPLATE, USER, TOOLS, "auto")
    streamed, final, reason = stream_all(plan, reply, rng.integers(1, 4, 200))
    assert "".join(streamed) + "".join(d.get("content", "") for d in final) == text
    assert len(streamed) > 1 and final == [] and reason == "stop"


def test_calls_come_whole_when_the_reply_is_complete():
    calls = '{"tool_calls": [{"name": "get_time", "arguments": {"zone": "UTC"}}]}'
    plan = plan_tools(GEMMA_TEMPLATE, USER, TOOLS, "auto")
    streamed, final, reason = stream_all(plan, calls, [3] * 30)
    assert streamed == [] and reason == "tool_calls"
    (delta,) = final
    assert delta["tool_calls"][0]["index"] == 0
    assert delta["tool_calls"][0]["function"] == {
        "name": "get_time",
        "arguments": '{"zone": "UTC"}',
    }
    hermes = plan_tools(HERMES, USER, TOOLS, "auto")
    text = (
        'One moment.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    )
    streamed, final, reason = stream_all(hermes, text, [2] * 50)
    assert "".join(streamed) == "One moment.\n" and reason == "tool_calls"
    assert final[-1]["tool_calls"][0]["function"]["name"] == "get_time"
    llama = plan_tools(LLAMA_JSON, USER, TOOLS, "auto")
    assert "".join(stream_all(llama, "Plain words here.", [4] * 5)[0]) == "Plain words here."
    assert (
        stream_all(llama, '{"name": "get_time", "parameters": {"zone": "UTC"}}', [4] * 20)[0] == []
    )
