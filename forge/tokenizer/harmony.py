"""The harmony chat format of gpt-oss: forge's fallback template, and the reply split into its
channels.

A harmony conversation is a sequence of messages ``<|start|>{role}<|message|>{text}<|end|>``; an
assistant message names its channel, ``<|start|>assistant<|channel|>{channel}<|message|>...``:
"analysis" holds the model's reasoning, "final" the answer for the user, "commentary" preambles
and tool calls (those carry `` to={recipient}`` in the header). The system message states the
reasoning effort and the valid channels; the user's system prompt becomes the developer
message's instructions. A reply ends with ``<|return|>`` (or ``<|call|>`` for a tool call).

Real gpt-oss files carry their own Jinja template, which forge renders; `HARMONY_TEMPLATE` is for
files without one (it offers ``tools`` as the format's ``functions`` namespace, each function's
parameters as their JSON schema). `HarmonyStream` turns the generated text (whose structural
tokens are rendered, as llama.cpp renders them) into ``content`` (final and commentary channels)
and ``reasoning_content`` (analysis), as llama-server's chat endpoint returns them, and collects
the tool calls (messages to ``functions.<name>``) as (name, arguments text).
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
    "{%- if ns.instructions or tools -%}"
    "<|start|>developer<|message|>"
    "{%- if ns.instructions %}{{ '# Instructions\n\n' + ns.instructions }}{% endif -%}"
    "{%- if ns.instructions and tools %}{{ '\n\n' }}{% endif -%}"
    "{%- if tools %}{{ '# Tools\n\n## functions\n\nnamespace functions {\n\n' }}"
    "{%- for t in tools %}{% set f = t['function'] -%}"
    "{%- if f.get('description') %}{{ '// ' + f['description'] + '\n' }}{% endif -%}"
    "{{ 'type ' + f['name'] + ' = (_: ' + (f.get('parameters', {}) | tojson)"
    " + ') => any;\n\n' }}"
    "{%- endfor %}{{ '} // namespace functions' }}{% endif -%}"
    "<|end|>"
    "{%- endif -%}"
    "{%- for m in messages if m['role'] not in ('system', 'developer') -%}"
    "{%- if m['role'] == 'assistant' and m.get('tool_calls') -%}"
    "{%- for c in m['tool_calls'] -%}"
    "<|start|>assistant<|channel|>commentary to=functions.{{ c['function']['name'] }}"
    " <|constrain|>json<|message|>{{ c['function']['arguments'] }}<|call|>"
    "{%- endfor -%}"
    "{%- elif m['role'] == 'assistant' -%}"
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
    marker at the end of the text). Messages to a function (`` to=functions.<name>`` in the
    role or the channel header) are not deltas: `calls` holds them as (name, arguments)."""

    def __init__(self) -> None:
        self._pending = ""
        self._state = "body"  # body, role (after <|start|>), header (after <|channel|>)
        self._role = self._header = ""  # the current message's role and channel header
        self._field = "content"  # where a body's text goes; text before any channel: content
        self._call: list[str] | None = None  # [name, arguments so far] of a call being read
        self.calls: list[tuple[str, str]] = []

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
        self._end_call()  # (the reply's last token, <|call|>, may not be in the text)
        return out

    def _on_marker(self, marker: str) -> None:
        if marker == START:  # (<|end|> and <|call|> are control tokens, often not in the text)
            self._end_call()
            self._state, self._role, self._header = "role", "", ""
        elif marker == CHANNEL:
            self._state, self._header = "header", ""
        elif marker == MESSAGE:
            self._state = "body"
            channel = self._header.split(" ", 1)[0].split(CONSTRAIN, 1)[0].strip()
            recipient = _recipient(self._role + " " + self._header)
            if recipient.startswith("functions."):
                self._field, self._call = "call", [recipient[len("functions.") :], ""]
            else:
                self._field = "reasoning_content" if channel == "analysis" else "content"
        else:  # END, RETURN, CALL: the message is over; stray text after it is content
            self._end_call()
            self._state, self._field = "body", "content"

    def _end_call(self) -> None:
        if self._call is not None:
            self.calls.append((self._call[0], self._call[1].strip()))
            self._call = None

    def _emit(self, text: str, out: list[dict[str, Any]]) -> None:
        if not text:
            return
        if self._state == "header":
            self._header += text
        elif self._state == "role":
            self._role += text
        elif self._call is not None:
            self._call[1] += text
        elif out and self._field in out[-1]:
            out[-1][self._field] += text
        else:
            out.append({self._field: text})


def parse_reply(text: str) -> tuple[str, str, list[tuple[str, str]]]:
    """(content, reasoning_content, calls as (function name, arguments text)) of a whole
    harmony reply."""
    stream = HarmonyStream()
    deltas = stream.push(text) + stream.finish()
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    return content, reasoning, stream.calls


def _recipient(header: str) -> str:
    """The `` to=<recipient>`` of a message's role or channel header ("" when none)."""
    for word in header.replace(CONSTRAIN, " ").split():
        if word.startswith("to="):
            return word[3:]
    return ""


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
