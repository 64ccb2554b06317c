"""Tool calling over HTTP: the request's ``tools``/``tool_choice`` planned by `forge.toolcall`,
the finished reply turned into OpenAI's ``tool_calls`` (whole, or as stream deltas).

A reply that may hold calls is parsed when it is complete, so with tools offered a streamed
reply arrives in one content or ``tool_calls`` delta before the finish chunk.
"""

from __future__ import annotations

from typing import Any

from forge.errors import UsageError
from forge.server.errors import bad_request, check
from forge.server.schemas import ChatRequest
from forge.tokenizer.chat import resolve_chat_template
from forge.toolcall import ToolCall, ToolPlan, plan_tools


def tool_plan(model: Any, body: ChatRequest) -> ToolPlan | None:
    """The plan for the request's tools (None without tools, or with tool_choice "none")."""
    choice = body.tool_choice if body.tool_choice is not None else "auto"
    check(body.tools or choice in ("auto", "none"), "tool_choice needs tools", "tool_choice")
    try:
        return plan_tools(resolve_chat_template(model.tokenizer), body.chat_messages(),
                          body.tools, choice, body.parallel_tool_calls)  # fmt: skip
    except UsageError as err:
        param = "tool_choice" if "tool_choice" in str(err) else "tools"
        raise bad_request(str(err), param) from None


def tool_message(plan: ToolPlan, text: str, reason: str) -> tuple[dict[str, Any], str]:
    """(the assistant message, finish reason) of a finished reply."""
    content, calls = plan.parse(text)
    if not calls:
        return {"role": "assistant", "content": content}, reason
    message = {"role": "assistant", "content": content,
               "tool_calls": [c.as_openai() for c in calls]}  # fmt: skip
    return message, "tool_calls" if reason == "stop" else reason


def tool_deltas(plan: ToolPlan, text: str, reason: str) -> tuple[list[dict[str, Any]], str]:
    """(the stream deltas, finish reason) of a finished reply."""
    content, calls = plan.parse(text)
    deltas: list[dict[str, Any]] = [{"content": content}] if content else []
    if calls:
        deltas.append({"tool_calls": [c.as_openai(i) for i, c in enumerate(calls)]})
        reason = "tool_calls" if reason == "stop" else reason
    return deltas, reason


__all__ = ["ToolCall", "tool_deltas", "tool_message", "tool_plan"]
