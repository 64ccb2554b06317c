"""What `forge run` and `forge chat` share: the sampling and output-shape flags (llama.cpp's
spellings), reading the prompt, and loading the model with a progress bar.

Sampling flags set config keys (``sampling.*``, ``max_tokens``), so their values are validated
with the configuration, before the model loads; ``--json-schema`` and ``--grammar`` are read
and compiled before the load too.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from forge.cli.common import add_config_flag
from forge.errors import UsageError


def add_sampling_flags(parser: Any) -> None:
    """Sampling flags (None = the configured default) and the structured-output flags."""
    g = parser.add_argument_group("sampling")
    add_config_flag(
        g,
        "-n",
        "--n-predict",
        "--max-tokens",
        key="max_tokens",
        help="tokens to generate (-1: until end of generation or a full context)",
    )
    for flags, key, what in (
        (("--temp", "--temperature"), "temperature", "0 = greedy"),
        (("--top-k",), "top_k", "keep the k most likely tokens (0 = off)"),
        (("--top-p",), "top_p", "nucleus mass to keep (1 = off)"),
        (("--min-p",), "min_p", "keep tokens with p >= min_p * max p (0 = off)"),
        (("--repeat-penalty",), "repeat_penalty", "1 = off"),
        (("--repeat-last-n",), "repeat_last_n", "tokens the penalties look back on (-1 = all)"),
        (("--presence-penalty",), "presence_penalty", "OpenAI presence penalty"),
        (("--frequency-penalty",), "frequency_penalty", "OpenAI frequency penalty"),
        (("--seed",), "seed", "RNG seed"),
        (("--samplers",), "chain", 'stage order, e.g. "top_k;top_p;min_p;temperature"'),
    ):
        add_config_flag(g, *flags, key=f"sampling.{key}", help=what)  # fmt: skip
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument(
        "--ignore-eos",
        action="store_true",
        help="never end at an end-of-generation token (only -n or the context ends)",
    )
    g = parser.add_argument_group("structured output")
    g.add_argument(
        "--json-schema",
        metavar="FILE|JSON",
        help="the output is JSON matching this schema (a file, or inline JSON)",
    )
    g.add_argument("--grammar", metavar="FILE", help="the output follows this GBNF or Lark grammar")


def checked_constraint(args: Any, ctx: Any) -> dict[str, str] | None:
    """The `Constraint` fields of --json-schema / --grammar, with the configured sampler chain
    built once with them: bad stage names, schemas and grammars fail before the model loads."""
    from forge.sampling import SamplingParams, build_sampler

    constraint = _constraint(args)
    values = ctx.config.sampling.model_dump(exclude_none=True)
    build_sampler(SamplingParams(**values, constraint=constraint), ctx.plugins.samplers)
    return constraint


def _constraint(args: Any) -> dict[str, str] | None:
    from forge.sampling.constrained import compile_grammar
    from forge.sampling.params import Constraint

    schema, grammar = getattr(args, "json_schema", None), getattr(args, "grammar", None)
    if schema and grammar:
        raise UsageError("--json-schema and --grammar cannot be combined")
    if schema:
        text = schema if schema.lstrip().startswith("{") else _read(schema, "--json-schema")
        constraint = {"kind": "json_schema", "text": text}
    elif grammar:
        constraint = {"kind": "grammar", "text": _read(grammar, "--grammar")}
    else:
        return None
    compile_grammar(Constraint(**constraint))
    return constraint


def generation_kwargs(args: Any, model: Any, constraint: dict[str, str] | None) -> dict:
    """The per-call arguments of `Model.generate` that the flags give (stop strings,
    --ignore-eos as a ban of the end-of-generation tokens, the constraint)."""
    kwargs: dict[str, Any] = {"stop": args.stop, "constraint": constraint}
    if args.ignore_eos:
        kwargs["logit_bias"] = {t: float("-inf") for t in model.tokenizer.eog_ids}
    return kwargs


def read_prompt(args: Any) -> str:
    """The prompt from -p TEXT, -f FILE, or stdin (``-p -``, or piped without -p/-f)."""
    if args.prompt is not None and args.file is not None:
        raise UsageError("give the prompt with -p or with -f, not both")
    text = ""
    if args.file is not None:
        text = _read(args.file, "-f")
    elif args.prompt == "-" or (args.prompt is None and not _stdin_is_terminal()):
        text = sys.stdin.read() if sys.stdin is not None else ""
        if not text.strip() and args.prompt == "-":
            raise UsageError("the prompt read from standard input (-p -) is empty")
    elif args.prompt is not None:
        text = args.prompt
    if args.prompt is None and args.file is None and not text.strip():
        raise UsageError(
            'no prompt: give one with -p "TEXT", -f FILE, or on standard input '
            '(echo "TEXT" | forge run); for a conversation, use forge chat'
        )
    if not text:
        raise UsageError("the prompt is empty")
    return text


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin is None or sys.stdin.isatty()
    except (OSError, ValueError):  # closed, or replaced by something that cannot tell
        return True


def _read(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{flag} {path}: not UTF-8 text") from None


def load_model(args: Any, ctx: Any):  # noqa: ANN201 - forge.Model
    """Load the model named on the command line (or configured, or the default). On a
    terminal a progress bar counts the layers; it appears once the backend is chosen (so the
    choice's log line is never inside it) and starts at the real layer count."""
    from forge.api import load

    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(total=total, desc="loading", unit="layer", file=sys.stderr, leave=False)
        bar.n = done
        bar.refresh()

    show = not getattr(args, "no_progress", False) and sys.stderr.isatty()
    try:
        return load(getattr(args, "model_path", None), config=ctx.config,
                    progress=progress if show else None)  # fmt: skip
    finally:
        if bar is not None:
            bar.close()
