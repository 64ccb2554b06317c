"""The ``forge chat`` loop: read a turn, stream the reply, keep the conversation.

On a terminal the line editor is prompt-toolkit, with history kept in
``$XDG_STATE_HOME/forge/chat_history`` (else ``~/.local/state/forge/chat_history``). Ctrl-C
during a reply stops it and returns to the prompt (the partial reply stays in the
conversation); Ctrl-C at the prompt clears the line; Ctrl-D or ``/bye`` leaves. Piped input is
read line by line, one turn per line, with no prompt.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

COMMANDS = {
    "/?": "show this help",
    "/help": "show this help",
    "/clear": "forget the conversation (the system prompt stays)",
    "/bye": "leave (Ctrl-D too)",
}
BANNER = "Chatting with {name}. Type /? for help, /bye or Ctrl-D to leave; Ctrl-C stops a reply."


class Conversation:
    """The turns so far and how to answer the next one (`reply` yields text pieces)."""

    def __init__(self, reply: Callable[[list[dict]], Iterator[str]], system: str | None):
        self._reply, self.system = reply, system
        self.messages: list[dict] = []
        self.clear()

    def clear(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def answer(self, text: str, out: Any) -> bool:
        """Stream the reply to `text` into `out`; False when Ctrl-C stopped it."""
        self.messages.append({"role": "user", "content": text})
        pieces: list[str] = []
        stopped = False
        try:
            for piece in self._reply(self.messages):
                pieces.append(piece)
                out.write(piece)
                out.flush()
        except KeyboardInterrupt:
            stopped = True
        out.write("\n")
        if stopped:
            sys.stderr.write("[reply stopped]\n")
        self.messages.append({"role": "assistant", "content": "".join(pieces).strip()})
        return not stopped


def history_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "forge" / "chat_history"


def _terminal_reader() -> Callable[[], str]:
    """A prompt-toolkit line reader with persistent history (raises EOFError on Ctrl-D and
    KeyboardInterrupt on Ctrl-C)."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    path = history_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        history: Any = FileHistory(str(path))
    except OSError:  # a read-only home: history for this session only
        history = InMemoryHistory()
    session: Any = PromptSession(history=history)
    return lambda: session.prompt(">>> ")


def _piped_reader() -> Callable[[], str]:
    def read() -> str:
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    return read


def run_repl(conversation: Conversation, name: str, interactive: bool) -> int:
    """The loop; returns the exit status (0 when the user leaves)."""
    read = _terminal_reader() if interactive else _piped_reader()
    if interactive:
        print(BANNER.format(name=name), file=sys.stderr)
    while True:
        try:
            line = read()
        except EOFError:  # Ctrl-D: leave on a clean line
            if interactive:
                sys.stderr.write("\n")
            return 0
        except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh line
            continue
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            if _command(text, conversation):
                return 0
            continue
        conversation.answer(line, sys.stdout)


def _command(text: str, conversation: Conversation) -> bool:
    """Run a slash command; True when it ends the chat."""
    word = text.split()[0].lower()
    if word in ("/bye", "/exit", "/quit"):
        return True
    if word == "/clear":
        conversation.clear()
        print("(conversation cleared)", file=sys.stderr)
    elif word in ("/?", "/help"):
        for name, what in COMMANDS.items():
            print(f"  {name:<7} {what}", file=sys.stderr)
    else:
        print(f"unknown command {word}; /? lists the commands", file=sys.stderr)
    return False
