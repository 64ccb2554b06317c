"""Tool calling over HTTP: the request's ``tools``/``tool_choice`` planned by `forge.toolcall`,
the finished reply turned into OpenAI's ``tool_calls`` (whole, or as stream deltas).

A streamed reply sends what is certainly content as it comes and the calls once the reply is
complete (`forge.toolcall_stream`).
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


tool_message = reply_message  # (the assistant message, finish reason) of a finished reply
