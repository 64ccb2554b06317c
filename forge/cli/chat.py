"""``forge chat [MODEL]``: an interactive conversation using the model's chat template."""

from __future__ import annotations

import sys
from typing import Any

from forge.cli.common import add_command
from forge.cli.run import add_sampling_flags, load_model, sampling_kwargs

ORDER = 11


def add_parser(subparsers: Any) -> None:
    p = add_command(subparsers, "chat", chat, "chat with a model (reads turns from stdin)")
    p.add_argument("model_path", nargs="?", metavar="MODEL", help="GGUF file (default model)")
    p.add_argument("-s", "--system", help="system prompt")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while loading")
    add_sampling_flags(p)


def chat(args: Any, ctx: Any) -> int:
    model = load_model(args, ctx)
    messages: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            sys.stderr.write("> ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        reply = []
        pieces = model.generate(model.chat_prompt(messages), max_tokens=args.max_tokens,
                                stop=args.stop, **sampling_kwargs(args))  # fmt: skip
        for piece in pieces:
            reply.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply).strip()})
