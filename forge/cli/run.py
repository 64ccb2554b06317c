"""``forge run [MODEL] -p PROMPT``: stream a continuation to stdout.

The prompt comes from ``-p TEXT``, ``-f FILE``, or standard input (``-p -``, or piped in with
neither); there is no built-in prompt.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from forge.cli.common import add_command
from forge.cli.generation_flags import (
    add_sampling_flags,
    checked_constraint,
    generation_kwargs,
    load_model,
    read_prompt,
)

ORDER = 10


def add_parser(subparsers: Any) -> None:
    p = add_command(subparsers, "run", run, "generate text from a prompt (default model if none)")
    p.add_argument(
        "model_path", nargs="?", metavar="MODEL", help="GGUF file (default: Gemma 3 270M)"
    )
    p.add_argument("-p", "--prompt", help='prompt text ("-" reads standard input)')
    p.add_argument("-f", "--file", metavar="FILE", help="read the prompt from FILE")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while loading")
    add_sampling_flags(p)


def run(args: Any, ctx: Any) -> int:
    prompt = read_prompt(args)  # every input is checked before the model loads
    constraint = checked_constraint(args, ctx)
    t0 = time.perf_counter()
    model = load_model(args, ctx)
    load_s = time.perf_counter() - t0
    for piece in model.generate(prompt, **generation_kwargs(args, model, constraint)):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    t = model.last_timings
    print(
        f"[{model.backend}] load {load_s:.2f} s | prompt {t['prompt_tokens']} tokens, "
        f"{_rate(t['prompt_tokens'], t['prompt_seconds'])} tok/s | generated "
        f"{t['generated_tokens']} tokens, "
        f"{_rate(t['generated_tokens'] - 1, t['generation_seconds'])} tok/s",
        file=sys.stderr,
    )
    return 0


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:.1f}" if seconds > 0 and n > 0 else "-"
