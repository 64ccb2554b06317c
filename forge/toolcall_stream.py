"""Streaming a reply to a request that offered tools: text that is certainly the reply's content
goes out as it arrives; calls go out once the reply is complete (their arguments must parse).

What is certainly content depends on the style (`forge.toolcall`):
- ``generic``: the characters of the JSON string in ``{"content": "...`` (escapes decoded as
  they complete), nothing while the reply may still be ``{"tool_calls": ...``;
- ``hermes``: the text before the first ``<tool_call>``, less a tail that could begin one;
- ``json``: the text, unless it starts like a call (``{``, ``[`` or ``<|python_tag|>``).
"""

from __future__ import annotations

import json
from typing import Any

from forge.generation import overlap
from forge.toolcall import ToolPlan

_GENERIC_CONTENT = '{"content": "'  # how the generic style's content reply starts (compact JSON)
_HERMES_OPEN = "<tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class ReplyStream:
    """Feed the reply's text with `push` (content deltas come back); `finish` gives the last
    deltas (rest of the content, the calls) and the finish reason."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.text = ""
        self.sent = ""  # content already sent

    def push(self, piece: str) -> list[dict[str, Any]]:
        self.text += piece
        content = self._certain_content()
        if len(content) <= len(self.sent):
            return []
        new, self.sent = content[len(self.sent) :], content
        return [{"content": new}]

    def finish(self, reason: str) -> tuple[list[dict[str, Any]], str]:
        content, calls = self.plan.parse(self.text)
        deltas: list[dict[str, Any]] = []
        if content and content.startswith(self.sent) and len(content) > len(self.sent):
            deltas.append({"content": content[len(self.sent) :]})
        if calls:
            deltas.append({"tool_calls": [c.as_openai(i) for i, c in enumerate(calls)]})
            reason = "tool_calls" if reason == "stop" else reason
        return deltas, reason

    def _certain_content(self) -> str:
        text, style = self.text, self.plan.style
        if style == "generic":
            if not text.startswith(_GENERIC_CONTENT):
                return ""
            return _string_prefix(text[len(_GENERIC_CONTENT) :])
        if style == "hermes":
            at = text.find(_HERMES_OPEN)
            if at >= 0:
                return text[:at]
            return text[: len(text) - overlap(text, _HERMES_OPEN)]
        start = text.lstrip()
        if not start or start[0] in "{[" or start.startswith(_PYTHON_TAG[: len(start)]):
            return ""
        return text


def _string_prefix(body: str) -> str:
    """The decoded characters of a JSON string's body up to its closing quote or its last
    complete character (an escape still being written is left out)."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == '"':
            break
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(body):
            break
        if body[i + 1] == "u":
            end = i + 6
            if end > len(body):
                break
            if 0xD800 <= int(body[i + 2 : end], 16) < 0xDC00:  # a surrogate pair: 12 chars
                end = i + 12
                if end > len(body):
                    break
            out.append(json.loads(f'"{body[i:end]}"'))
            i = end
            continue
        out.append(_ESCAPES.get(body[i + 1], body[i + 1]))
        i += 2
    return "".join(out)
