"""The harmony chat format of gpt-oss: forge's fallback template, and the reply split into its
channels.

A harmony conversation is a sequence of messages ``<|start|>{role}<|message|>{text}<|end|>``; an
assistant message names its channel, ``<|start|>assistant<|channel|>{channel}<|message|>...``:
"analysis" holds the model's reasoning, "final" the answer for the user, "commentary" preambles
and tool calls (those carry `` to={recipient}`` in the header). The system message states the
reasoning effort and the valid channels; the user's system prompt becomes the developer
message's instructions. A reply ends with ``<|return|>`` (or ``<|call|>`` for a tool call).

Real gpt-oss files carry their own Jinja template, which forge renders; `HARMONY_TEMPLATE` is for
files without one. `HarmonyStream` turns the generated text (whose structural tokens are
rendered, as llama.cpp renders them) into ``content`` (final and commentary channels) and
``reasoning_content`` (analysis), as llama-server's chat endpoint returns them.
"""

from __future__ import annotations

from typing import Any

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
RETURN, CALL, CONSTRAIN = "<|return|>", "<|call|>", "<|constrain|>"
_MARKERS = (START, CHANNEL, MESSAGE, END, RETURN, CALL)

# Written for forge from the format's description (not a copy of any model's template).
HARMONY_TEMPLATE = (
    "{%- set ns = namespace(instructions='') -%}"
    "{%- for m in messages if m['role'] in ('system', 'developer') -%}"
    "{%- set ns.instructions = ns.instructions + ('\n\n' if ns.instructions else '')"
    " + m['content'] -%}"
    "{%- endfor -%}"
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}\n\n"
    "# Valid channels: analysis, commentary, final."
    " Channel must be included for every message.<|end|>"
    "{%- if ns.instructions -%}"
    "<|start|>developer<|message|># Instructions\n\n{{ ns.instructions }}<|end|>"
    "{%- endif -%}"
    "{%- for m in messages if m['role'] not in ('system', 'developer') -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "<|start|>assistant<|channel|>final<|message|>{{ m['content'] }}<|end|>"
    "{%- elif m['role'] == 'tool' -%}"
    "<|start|>functions.{{ m.get('name') or 'tool' }} to=assistant<|channel|>commentary"
    "<|message|>{{ m['content'] }}<|end|>"
    "{%- else -%}"
    "<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|start|>assistant{% endif -%}"
)


def is_harmony(template: str | None) -> bool:
    """Whether a chat template writes harmony messages (channels and message markers)."""
    return bool(template) and CHANNEL in template and MESSAGE in template


class HarmonyStream:
    """Feed a reply's text with `push`; deltas come back as ``{"content": ...}`` or
    ``{"reasoning_content": ...}``. `finish` gives what was held back (a possible start of a
    marker at the end of the text)."""

    def __init__(self) -> None:
        self._pending = ""
        self._state = "body"  # body, role (after <|start|>), header (after <|channel|>)
        self._header = ""  # the current message's channel header
        self._field = "content"  # where a body's text goes; text before any channel: content

    def push(self, text: str) -> list[dict[str, Any]]:
        self._pending += text
        out: list[dict[str, Any]] = []
        while self._pending:
            at, marker = _next_marker(self._pending)
            if marker is None:
                keep = _marker_start(self._pending)
                self._emit(self._pending[: len(self._pending) - keep], out)
                self._pending = self._pending[len(self._pending) - keep :]
                break
            self._emit(self._pending[:at], out)
            self._pending = self._pending[at + len(marker) :]
            self._on_marker(marker)
        return out

    def finish(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        self._emit(self._pending, out)
        self._pending = ""
        return out

    def _on_marker(self, marker: str) -> None:
        if marker == START:
            self._state, self._header = "role", ""
        elif marker == CHANNEL:
            self._state, self._header = "header", ""
        elif marker == MESSAGE:
            self._state = "body"
            channel = self._header.split(" ", 1)[0].split(CONSTRAIN, 1)[0].strip()
            self._field = "reasoning_content" if channel == "analysis" else "content"
        else:  # END, RETURN, CALL: the message is over; stray text after it is content
            self._state, self._field = "body", "content"

    def _emit(self, text: str, out: list[dict[str, Any]]) -> None:
        if not text:
            return
        if self._state == "header":
            self._header += text
        elif self._state == "body":
            if out and self._field in out[-1]:
                out[-1][self._field] += text
            else:
                out.append({self._field: text})


def split_reply(text: str) -> tuple[str, str]:
    """(content, reasoning_content) of a whole harmony reply."""
    stream = HarmonyStream()
    deltas = stream.push(text) + stream.finish()
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    return content, reasoning


def _marker_start(text: str) -> int:
    """Length of the longest end of `text` that could be the beginning of a marker."""
    for n in range(min(len(text), max(map(len, _MARKERS)) - 1), 0, -1):
        if any(m.startswith(text[-n:]) for m in _MARKERS):
            return n
    return 0


def _next_marker(text: str) -> tuple[int, str | None]:
    """(index, marker) of the first marker in `text`, or (-1, None)."""
    best, found = -1, None
    for marker in _MARKERS:
        at = text.find(marker)
        if at >= 0 and (best < 0 or at < best):
            best, found = at, marker
    return best, found
