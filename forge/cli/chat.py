"""``forge chat [MODEL]``: an interactive conversation using the model's chat template."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from forge.cli.common import add_command
from forge.cli.generation_flags import (
    add_sampling_flags,
    checked_constraint,
    generation_kwargs,
    load_model,
)
from forge.cli.repl import Conversation, run_repl
from forge.tokenizer.chat import resolve_chat_template
from forge.tokenizer.harmony import HarmonyStream, is_harmony
from forge.tokenizer.template_info import template_warning

ORDER = 11
log = logging.getLogger("forge")


def add_parser(subparsers: Any) -> None:
    p = add_command(
        subparsers,
        "chat",
        chat,
        "chat with a model (line editing and history on a terminal; /? for help)",
    )
    p.add_argument("model_path", nargs="?", metavar="MODEL", help="GGUF file (default model)")
    p.add_argument("-s", "--system", help="system prompt")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while loading")
    add_sampling_flags(p)  # fmt: skip


def chat(args: Any, ctx: Any) -> int:
    constraint = checked_constraint(args, ctx)
    model = load_model(args, ctx)
    warning = template_warning(model)
    if warning:
        log.warning("%s", warning)

    kwargs = generation_kwargs(args, model, constraint)
    harmony = is_harmony(resolve_chat_template(model.tokenizer))

    def reply(messages: list[dict]):  # noqa: ANN202 - Iterator[str]
        pieces = model.generate(model.chat_prompt(messages), **kwargs)
        return final_channel(pieces, sys.stderr) if harmony else pieces

    name = model.spec.name or model.path
    return run_repl(Conversation(reply, args.system), name, _interactive())


def final_channel(pieces: Iterator[str], reasoning: TextIO) -> Iterator[str]:
    """The final channel of a harmony reply (what the conversation keeps), its analysis
    written to `reasoning` as it comes."""
    channels = HarmonyStream()
    for piece in pieces:
        for delta in channels.push(piece):
            if "reasoning_content" in delta:
                reasoning.write(delta["reasoning_content"])
                reasoning.flush()
            else:
                yield delta["content"]
    yield from (d.get("content", "") for d in channels.finish())


def _interactive() -> bool:
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (OSError, ValueError):
        return False
