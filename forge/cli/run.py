"""``forge run [MODEL] -p PROMPT``: stream a continuation to stdout."""

from __future__ import annotations

import sys
import time
from typing import Any

from forge.cli.common import add_command

ORDER = 10


def add_sampling_flags(parser: Any) -> None:
    """Sampling flags shared by run, chat and bench (None = the configured default)."""
    g = parser.add_argument_group("sampling")
    g.add_argument("-n", "--max-tokens", type=int, default=128, help="tokens to generate")
    g.add_argument("--temperature", "--temp", type=float, help="0 = greedy")
    g.add_argument("--top-k", type=int)
    g.add_argument("--top-p", type=float)
    g.add_argument("--min-p", type=float)
    g.add_argument("--repeat-penalty", type=float)
    g.add_argument("--presence-penalty", type=float)
    g.add_argument("--frequency-penalty", type=float)
    g.add_argument("--seed", type=int)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")


def sampling_kwargs(args: Any) -> dict[str, Any]:
    names = (
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
        "seed",
    )
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def add_parser(subparsers: Any) -> None:
    p = add_command(subparsers, "run", run, "generate text from a prompt (default model if none)")
    p.add_argument(
        "model_path", nargs="?", metavar="MODEL", help="GGUF file (default: Gemma 3 270M)"
    )
    p.add_argument("-p", "--prompt", default="The capital of France is", help="prompt text")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while loading")
    add_sampling_flags(p)


def load_model(args: Any, ctx: Any):  # noqa: ANN201 - forge.Model
    """Load the model named on the command line (or configured, or the default) with a bar."""
    from forge.api import load

    bar = None
    progress = None
    if not getattr(args, "no_progress", False) and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=1, desc="loading", unit="layer", file=sys.stderr, leave=False)

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

    try:
        return load(getattr(args, "model_path", None), config=ctx.config, progress=progress)
    finally:
        if bar is not None:
            bar.close()


def run(args: Any, ctx: Any) -> int:
    t0 = time.perf_counter()
    model = load_model(args, ctx)
    load_s = time.perf_counter() - t0
    pieces = model.generate(
        args.prompt, max_tokens=args.max_tokens, stop=args.stop, **sampling_kwargs(args)
    )
    for piece in pieces:
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
