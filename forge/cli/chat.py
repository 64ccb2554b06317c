"""``forge chat [MODEL]``: an interactive conversation using the model's chat template."""

from __future__ import annotations

import logging
import sys
from typing import Any

from forge.cli.common import add_command
from forge.cli.generation_flags import (
    add_sampling_flags,
    checked_constraint,
    generation_kwargs,
    load_model,
)
from forge.cli.repl import Conversation, run_repl
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

    def reply(messages: list[dict]):  # noqa: ANN202 - Iterator[str]
        return model.generate(model.chat_prompt(messages), **kwargs)

    name = model.spec.name or model.path
    return run_repl(Conversation(reply, args.system), name, _interactive())


def _interactive() -> bool:
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (OSError, ValueError):
        return False
