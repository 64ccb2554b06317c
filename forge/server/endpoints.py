"""POST /v1/completions and /v1/chat/completions: OpenAI request in, OpenAI response out.

Both endpoints build a `SequenceState` through `Model.start` (so prompt and sampling validation is
the engine's), queue it on the scheduler, then either collect the whole answer or stream it as
server-sent events ending with ``data: [DONE]``. A client that goes away cancels its sequence.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from forge.completions import harmony_finish, harmony_message
from forge.generation import TokenEvent
from forge.scheduler import Finished
from forge.server.errors import APIError, bad_request, check
from forge.server.limits import clamp_max_tokens
from forge.server.schemas import UNSUPPORTED, ChatRequest, CompletionRequest, SamplingFields
from forge.server.service import Generation, Service
from forge.server.structured import response_constraint
from forge.server.tools import tool_message, tool_plan
from forge.tokenizer.chat import resolve_chat_template
from forge.tokenizer.harmony import HarmonyStream, is_harmony
from forge.toolcall_stream import ReplyStream


def _check_common(service: Service, body: SamplingFields) -> None:
    if body.model is not None and body.model != service.id:
        raise APIError(404, f"the model {body.model!r} does not exist; this server serves "
                       f"{service.id!r}", param="model", code="model_not_found")  # fmt: skip
    check(body.n == 1, "only n=1 is supported", "n")
    for name in UNSUPPORTED:
        check(name not in (body.model_extra or {}), f"{name} is not supported", name)


def _sampling(service: Service, body: SamplingFields) -> dict[str, Any]:
    bias = None
    if body.logit_bias:
        bias = {}
        for key, value in body.logit_bias.items():
            # ASCII digits only: str.isdigit() accepts "²", and int() refuses 5,000 digits
            known = key.isascii() and key.isdigit() and len(key) <= 12
            known = known and int(key) < service.model.n_vocab
            check(known, f"logit_bias key {key!r} is not a token id of this model", "logit_bias")
            check(-100 <= value <= 100, "logit_bias values must be in -100..100", "logit_bias")
            bias[int(key)] = value
    values = {
        "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
        "min_p": body.min_p, "repeat_penalty": body.repeat_penalty, "seed": body.seed,
        "presence_penalty": body.presence_penalty, "frequency_penalty": body.frequency_penalty,
        "logit_bias": bias, "chain": body.samplers,
    }  # fmt: skip
    return {k: v for k, v in values.items() if v is not None}


def _usage(done: Finished, gen: Generation) -> dict[str, int]:
    usage = {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
             "total_tokens": done.prompt_tokens + done.completion_tokens}  # fmt: skip
    if gen.max_tokens_clamped is not None:  # the request asked for more than the context holds
        usage["max_tokens_clamped_to"] = gen.max_tokens_clamped
    return usage


def _finish_reason(done: Finished) -> str:
    if done.finish_reason == "error":
        raise APIError(500, f"generation failed: {done.error}", "server_error")
    return done.finish_reason


async def _collect(gen: Generation, request: Request) -> list[TokenEvent]:
    """Every event of a non-streaming request; cancels it as soon as the client disconnects."""

    async def watch() -> None:
        # the body is read, so the next ASGI message is the disconnect (if it ever comes)
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gen.cancel()

    watcher = asyncio.create_task(watch())
    events = []
    try:
        while True:
            for message in await gen.take():
                if isinstance(message, Finished):
                    if message.finish_reason == "cancelled":
                        raise APIError(499, "client disconnected")
                    return events
                events.append(message)
    finally:
        watcher.cancel()
        gen.cancel()  # no-op once finished


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


_SLOT = "\ufdd0forge-slot\ufdd0"  # a noncharacter marks where `_sse_with_slot` puts its value


def _sse_with_slot(chunk: dict) -> Callable[[str], str]:
    """The SSE event of `chunk`, one of whose strings is `_SLOT`, as a function of that string:
    the rest of the JSON is encoded once per response instead of once per event."""
    before, after = _sse(chunk).split(json.dumps(_SLOT, ensure_ascii=False))
    return lambda value: before + json.dumps(value, ensure_ascii=False) + after


def _error_event(err: APIError) -> str:
    return _sse({"error": {"message": err.message, "type": err.type, "param": None,
                           "code": err.code}})  # fmt: skip


async def _stream(
    gen: Generation,
    on_tokens: Callable[[list[TokenEvent]], str],
    on_finish: Callable[[Finished], str],
    prefix: str = "",
) -> AsyncIterator[str]:
    """SSE text: `prefix`, then for each batch of messages `gen.take()` gives, the events of
    `on_tokens(token events)` and, at the end, of `on_finish(finished)` and ``data: [DONE]``,
    all in one write. A stream that fell behind thus sends its queued tokens as one event.
    Cancelling the iterator (the client disconnected) cancels the sequence."""
    try:
        if prefix:
            yield prefix
        while True:
            messages = await gen.take()
            done = messages[-1] if isinstance(messages[-1], Finished) else None
            events = messages[:-1] if done is not None else messages
            text = on_tokens(events) if events else ""
            if done is not None:
                try:
                    text += on_finish(done) + "data: [DONE]\n\n"
                except APIError as err:
                    text += _error_event(err)
            if text:
                yield text
            if done is not None:
                return
    finally:
        gen.cancel()


def _streaming_response(lines: AsyncIterator[str]) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(lines, media_type="text/event-stream", headers=headers)


async def _start(service: Service, prompt: Any, body: SamplingFields, max_tokens: int | None,
                 logprobs: int | None, constraint: dict | None = None) -> Generation:  # fmt: skip
    """Validate and queue a request; tokenizing (up to the body limit's worth of text) runs off
    the event loop. `max_tokens` None: the configured default (Model.max_tokens); a max_tokens
    beyond the context is clamped to it, and the usage says so. `constraint` (a tool plan's)
    replaces response_format's."""
    model = service.model
    constraint = constraint or response_constraint(body)
    state = await asyncio.to_thread(
        model.start, prompt, max_tokens=max_tokens, stop=body.stop_list(), logprobs=logprobs,
        constraint=constraint, **_sampling(service, body))  # fmt: skip
    clamped = clamp_max_tokens(state, max_tokens)
    gen = service.generate(state)
    gen.max_tokens_clamped = clamped
    return gen


# -- /v1/completions ---------------------------------------------------------------------------
async def completions(service: Service, body: CompletionRequest, request: Request):
    _check_common(service, body)
    check(not body.echo, "echo is not supported", "echo")
    check(body.best_of in (None, 1), "only best_of=1 is supported", "best_of")
    check(body.suffix is None, "suffix is not supported", "suffix")
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        check(len(prompt) == 1, "only one prompt per request is supported", "prompt")
        prompt = prompt[0]
    gen = request.state.generation = await _start(service, prompt, body, body.max_tokens,
                                                  body.logprobs)  # fmt: skip
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    base = {"id": rid, "object": "text_completion", "created": created, "model": service.id}

    def choice(text: str, events: list[TokenEvent], reason: str | None, at: int = 0) -> dict:
        lp = _completion_logprobs(service, events, at) if body.logprobs is not None else None
        return {"index": 0, "text": text, "logprobs": lp, "finish_reason": reason}

    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        text_event = _sse_with_slot({**base, "choices": [choice(_SLOT, [], None)]})
        offset = 0  # text_offset of the next token: streamed logprobs concatenate like whole

        def on_tokens(events: list[TokenEvent]) -> str:
            nonlocal offset
            text = "".join(e.text for e in events)
            if body.logprobs is None:
                return text_event(text) if text else ""
            c = choice(text, events, None, offset)
            offset += sum(len(t) for t in c["logprobs"]["tokens"])
            return _sse({**base, "choices": [c]})

        def on_finish(done: Finished) -> str:
            out = _sse({**base, "choices": [choice("", [], _finish_reason(done))]})
            if usage:
                out += _sse({**base, "choices": [], "usage": _usage(done, gen)})
            return out

        return _streaming_response(_stream(gen, on_tokens, on_finish))
    events = await _collect(gen, request)
    done = gen.finished
    reason = _finish_reason(done)
    text = "".join(e.text for e in events)
    usage = _usage(done, gen)
    return JSONResponse({**base, "choices": [choice(text, events, reason)], "usage": usage})


def _completion_logprobs(service: Service, events: list[TokenEvent], at: int = 0) -> dict:
    """OpenAI's completion logprobs of `events`; text offsets start at `at`."""
    tokens = [service.token_text(e.token) for e in events]
    offsets = []
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in events],
        "top_logprobs": [_top_by_text(service, e) for e in events],
        "text_offset": offsets,
    }


def _top_by_text(service: Service, e: TokenEvent) -> dict[str, float]:
    """{token text: logprob}, best first; tokens sharing a text (byte pieces) keep the best."""
    top: dict[str, float] = {}
    for t, lp in e.top_logprobs:
        top.setdefault(service.token_text(t), lp)
    return top


# -- /v1/chat/completions ----------------------------------------------------------------------
async def chat_completions(service: Service, body: ChatRequest, request: Request):
    _check_common(service, body)
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs requires logprobs=true", "top_logprobs")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    plan = tool_plan(service.model, body)
    check(not (plan and plan.constraint and body.response_format
               and body.response_format.type != "text"),
          "response_format cannot be combined with a tool_choice that forces a call "
          "(or with tools, for this model's template)", "response_format")  # fmt: skip
    messages, extra = (plan.messages, plan.template_vars) if plan else (body.chat_messages(), {})
    extra = {**body.template_variables(), **extra}
    ids = await asyncio.to_thread(service.chat_prompt, messages, **extra)
    max_tokens = body.max_completion_tokens or body.max_tokens
    constraint = plan.constraint if plan else None
    gen = request.state.generation = await _start(service, ids, body, max_tokens, logprobs,
                                                  constraint)  # fmt: skip
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    # a harmony reply: its final channel is the content, its analysis the reasoning_content
    # (and its calls, with tools offered: plan_tools gives them the "harmony" style)
    harmony = is_harmony(resolve_chat_template(service.model.tokenizer))

    def lp(events: list[TokenEvent]) -> dict | None:
        return {"content": [_chat_logprob(service, e) for e in events]} if body.logprobs else None

    if body.stream:
        base = {"id": rid, "object": "chat.completion.chunk", "created": created,
                "model": service.id}  # fmt: skip
        usage = bool(body.stream_options and body.stream_options.include_usage)
        first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "logprobs": None, "finish_reason": None}]}  # fmt: skip
        delta = {"index": 0, "delta": {"content": _SLOT}, "logprobs": None, "finish_reason": None}
        content_event = _sse_with_slot({**base, "choices": [delta]})

        # content now, calls at the end
        reply = ReplyStream(plan) if plan is not None and not harmony else None
        channels = HarmonyStream() if harmony else None

        def deltas_sse(deltas: list[dict], logprobs: dict | None = None) -> str:
            return "".join(_sse({**base, "choices": [{"index": 0, "delta": d, "finish_reason": None,
                                "logprobs": logprobs if i == 0 else None}]})
                           for i, d in enumerate(deltas))  # fmt: skip

        def on_tokens(events: list[TokenEvent]) -> str:
            text = "".join(e.text for e in events)
            if channels is not None:
                return deltas_sse(channels.push(text), lp(events))
            if reply is not None:
                return "".join(_sse({**base, "choices": [{"index": 0, "delta": d,
                                    "logprobs": None, "finish_reason": None}]})
                               for d in reply.push(text))  # fmt: skip
            if not body.logprobs:
                return content_event(text) if text else ""
            c = {"index": 0, "delta": {"content": text}, "logprobs": lp(events),
                 "finish_reason": None}  # fmt: skip
            return _sse({**base, "choices": [c]})

        def on_finish(done: Finished) -> str:
            reason, out = _finish_reason(done), ""
            if channels is not None:
                deltas, reason = harmony_finish(channels, plan, reason)
                out += deltas_sse(deltas)
            if reply is not None:
                deltas, reason = reply.finish(reason)
                for d in deltas:
                    c = {"index": 0, "delta": d, "logprobs": None, "finish_reason": None}
                    out += _sse({**base, "choices": [c]})
            c = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
            out += _sse({**base, "choices": [c]})
            if usage:
                out += _sse({**base, "choices": [], "usage": _usage(done, gen)})
            return out

        return _streaming_response(_stream(gen, on_tokens, on_finish, _sse(first)))
    events = await _collect(gen, request)
    done = gen.finished
    reason = _finish_reason(done)
    message = {"role": "assistant", "content": "".join(e.text for e in events)}
    if harmony:
        message, reason = harmony_message(message["content"], plan, reason)
    elif plan is not None:
        message, reason = tool_message(plan, message["content"], reason)
    choice = {"index": 0, "message": message, "logprobs": lp(events), "finish_reason": reason}
    return JSONResponse({"id": rid, "object": "chat.completion", "created": created,
                         "model": service.id, "choices": [choice],
                         "usage": _usage(done, gen)})  # fmt: skip


def _chat_logprob(service: Service, e: TokenEvent) -> dict:
    def entry(token: int, logprob: float | None) -> dict:
        return {"token": service.token_text(token), "logprob": logprob,
                "bytes": service.token_bytes(token)}  # fmt: skip

    return {**entry(e.token, e.logprob), "top_logprobs": [entry(t, p) for t, p in e.top_logprobs]}
