"""OpenAI-shaped completions on a loaded `forge.Model`, as llama-cpp-python users know them:
`create_completion` and `create_chat_completion` return the response dict, or with
``stream=True`` an iterator of chunk dicts; `chat` returns the reply text (or its pieces).

Chat requests take ``tools``/``tool_choice`` (`forge.toolcall`) and ``response_format``
(``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"schema": ...}}``);
every other keyword is a sampling parameter (`forge.sampling.SamplingParams`), ``stop`` or
``max_tokens`` (None: the configured default, -1: no limit but the context).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from forge.errors import UsageError
from forge.tokenizer.chat import resolve_chat_template
from forge.tokenizer.harmony import HarmonyStream, is_harmony, parse_reply
from forge.toolcall import ToolPlan, plan_tools
from forge.toolcall_stream import ReplyStream


def response_format_constraint(response_format: Mapping[str, Any] | None) -> dict | None:
    """The `Constraint` fields of an OpenAI ``response_format`` (None for plain text). Also
    takes llama-server's ``{"type": "json_object", "schema": {...}}``."""
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
    elif kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if schema is None:
            raise UsageError("response_format of type json_schema needs json_schema.schema")
    else:
        raise UsageError(f"response_format type must be text, json_object or json_schema, "
                         f"got {kind!r}")  # fmt: skip
    if schema is None:
        return {"kind": "json_object"}
    return {"kind": "json_schema", "text": json.dumps(schema)}


def create_completion(model: Any, prompt: str | list[int], *, stream: bool = False,
                      response_format: Mapping | None = None, **kwargs: Any) -> Any:  # fmt: skip
    """An OpenAI ``text_completion`` dict, or an iterator of its chunks with `stream`."""
    constraint = response_format_constraint(response_format)
    state = model.start(prompt, constraint=constraint, **kwargs)
    base = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": _model_id(model)}  # fmt: skip

    def choice(text: str, reason: str | None) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

    if stream:
        return _chunks(model, state, base, lambda t: choice(t, None),
                       lambda: choice("", state.finish_reason or "length"))  # fmt: skip
    text = "".join(model.run(state))
    return {**base, "choices": [choice(text, state.finish_reason or "length")],
            "usage": _usage(state)}  # fmt: skip


def create_chat_completion(model: Any, messages: list[dict], *, stream: bool = False,
                           tools: list[dict] | None = None, tool_choice: Any = None,
                           parallel_tool_calls: bool | None = None,
                           response_format: Mapping | None = None,
                           **kwargs: Any) -> Any:  # fmt: skip
    """An OpenAI ``chat.completion`` dict, or an iterator of ``chat.completion.chunk`` dicts
    with `stream` (with tools offered, content streams as it comes and calls come whole once
    the reply is complete)."""
    choice = "auto" if tool_choice is None else tool_choice
    template = resolve_chat_template(model.tokenizer)
    plan = plan_tools(template, messages, tools, choice, parallel_tool_calls)
    constraint = response_format_constraint(response_format)
    if plan is not None and plan.constraint is not None:
        if constraint is not None:
            raise UsageError(
                "response_format cannot be combined with tools that constrain the reply "
                "(a forcing tool_choice, or this model's template)"
            )
        constraint = plan.constraint
    ids = model.chat_prompt(plan.messages, **plan.template_vars) if plan else model.chat_prompt(
        messages)  # fmt: skip
    state = model.start(ids, constraint=constraint, **kwargs)
    base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": _model_id(model)}  # fmt: skip
    # channels: content and reasoning_content (and the calls: plan_tools gives a harmony
    # template's tools the "harmony" style)
    harmony = is_harmony(template)
    if stream:
        return _chat_chunks(model, state, {**base, "object": "chat.completion.chunk"}, plan,
                            harmony)  # fmt: skip
    text = "".join(model.run(state))
    if harmony:
        message, reason = harmony_message(text, plan, state.finish_reason or "length")
    else:
        message, reason = reply_message(plan, text, state.finish_reason or "length")
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
    return {**base, "object": "chat.completion", "choices": [choice], "usage": _usage(state)}


def chat(model: Any, messages: list[dict], *, stream: bool = False, **kwargs: Any) -> Any:
    """The assistant's reply to `messages` as text, or an iterator of its pieces."""
    if stream:
        chunks = create_chat_completion(model, messages, stream=True, **kwargs)
        return (c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    reply = create_chat_completion(model, messages, **kwargs)
    return reply["choices"][0]["message"]["content"] or ""


def _chat_chunks(model: Any, state: Any, base: dict, plan: ToolPlan | None,
                 harmony: bool = False) -> Iterator[dict]:  # fmt: skip
    def chunk(delta: dict, reason: str | None = None) -> dict:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                     "finish_reason": reason}]}  # fmt: skip

    yield chunk({"role": "assistant", "content": ""})
    if harmony:
        channels = HarmonyStream()
        for piece in model.run(state):
            yield from (chunk(d) for d in channels.push(piece))
        deltas, reason = harmony_finish(channels, plan, state.finish_reason or "length")
        yield from (chunk(d) for d in deltas)
        yield chunk({}, reason)
        return
    if plan is None:
        for piece in model.run(state):
            yield chunk({"content": piece})
        yield chunk({}, state.finish_reason or "length")
        return
    reply = ReplyStream(plan)  # content as it comes, calls once the reply is complete
    for piece in model.run(state):
        for delta in reply.push(piece):
            yield chunk(delta)
    deltas, reason = reply.finish(state.finish_reason or "length")
    for delta in deltas:
        yield chunk(delta)
    yield chunk({}, reason)


def _chunks(model: Any, state: Any, base: dict, piece: Any, last: Any) -> Iterator[dict]:
    for text in model.run(state):
        yield {**base, "choices": [piece(text)]}
    yield {**base, "choices": [last()]}


def reply_message(plan: ToolPlan | None, text: str, reason: str) -> tuple[dict, str]:
    """(the assistant message, finish reason) of a finished reply: with tools offered, its
    calls parsed into OpenAI ``tool_calls`` (finish reason "tool_calls")."""
    if plan is None:
        return {"role": "assistant", "content": text}, reason
    content, calls = plan.parse(text)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [c.as_openai() for c in calls]
        reason = "tool_calls" if reason == "stop" else reason
    return message, reason


def harmony_message(text: str, plan: ToolPlan | None, reason: str) -> tuple[dict, str]:
    """(the assistant message, finish reason) of a harmony reply: the final channel as
    ``content``, the analysis channel as ``reasoning_content`` (when there is one), as
    llama-server returns them; with tools offered, calls as ``tool_calls``."""
    content, reasoning, found = parse_reply(text)
    calls = plan.harmony_calls(found) if plan is not None else []
    message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [c.as_openai() for c in calls]
        reason = "tool_calls" if reason == "stop" else reason
    return message, reason


def harmony_finish(channels: HarmonyStream, plan: ToolPlan | None,
                   reason: str) -> tuple[list[dict], str]:  # fmt: skip
    """The last deltas of a streamed harmony reply (text held back, then its calls) and the
    finish reason."""
    deltas = channels.finish()
    calls = plan.harmony_calls(channels.calls) if plan is not None else []
    if calls:
        deltas.append({"tool_calls": [c.as_openai(i) for i, c in enumerate(calls)]})
        reason = "tool_calls" if reason == "stop" else reason
    return deltas, reason


def _usage(state: Any) -> dict[str, int]:
    prompt, generated = len(state.prompt), len(state.generated)
    return {"prompt_tokens": prompt, "completion_tokens": generated,
            "total_tokens": prompt + generated}  # fmt: skip


def _model_id(model: Any) -> str:
    from pathlib import Path

    return Path(model.path).stem
