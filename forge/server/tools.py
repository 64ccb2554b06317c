"""Tool calling over HTTP: the request's ``tools``/``tool_choice`` planned by `forge.toolcall`,
the finished reply turned into OpenAI's ``tool_calls`` (whole, or as stream deltas).

A reply that may hold calls is parsed when it is complete, so with tools offered a streamed
reply arrives in one content or ``tool_calls`` delta before the finish chunk.
"""

from __future__ import annotations

from typing import Any

from forge.completions import reply_message
from forge.errors import UsageError
from forge.server.errors import bad_request, check
from forge.server.schemas import ChatRequest
from forge.tokenizer.chat import resolve_chat_template
from forge.toolcall import ToolPlan, plan_tools


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


def tool_deltas(plan: ToolPlan, text: str, reason: str) -> tuple[list[dict[str, Any]], str]:
    """(the stream deltas, finish reason) of a finished reply."""
    message, reason = reply_message(plan, text, reason)
    deltas: list[dict[str, Any]] = [{"content": message["content"]}] if message["content"] else []
    if message.get("tool_calls"):
        calls = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        deltas.append({"tool_calls": calls})
    return deltas, reason


tool_message = reply_message  # (the assistant message, finish reason) of a finished reply
