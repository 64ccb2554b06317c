"""``forge bench [MODEL]``: prefill and generation throughput, like llama-bench.

``-p 128,512 -n 32,128`` run one prompt-processing test per -p value and one generation test
per -n value (0 skips that kind), each ``-r`` times, after ``-d`` tokens already cached (a comma
list too); prompts run in pieces of ``-ub`` tokens (default: the backend's); tg steps run as
generation runs them (one ahead on a backend that feeds its picks on the device), or each after
the last token was read with ``--tg-sync``; ``-o md|csv|json|jsonl`` picks the output.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from forge.bench_report import FORMATS, BenchRow, model_facts, render
from forge.cli.common import add_command
from forge.errors import UsageError

ORDER = 30


def _counts(text: str) -> list[int]:
    """A comma list of token counts ("128,512")."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"expected a comma list of whole numbers, got {text!r}") from None
    if not values or min(values) < 0:
        raise UsageError(f"expected a comma list of counts >= 0, got {text!r}")
    return values


def add_parser(subparsers: Any) -> None:
    p = add_command(subparsers, "bench", bench, "measure prefill and generation speed")
    p.add_argument("model_path", nargs="?", metavar="MODEL", help="GGUF file (default model)")
    p.add_argument(
        "-p",
        "--n-prompt",
        default="512",
        metavar="N[,N...]",
        help="prompt lengths, one pp test each (default 512; 0 = none)",
    )
    p.add_argument(
        "-n",
        "--n-gen",
        default="128",
        metavar="N[,N...]",
        help="generated lengths, one tg test each (default 128; 0 = none)",
    )
    p.add_argument(
        "-d",
        "--n-depth",
        default="0",
        metavar="N[,N...]",
        help="tokens already in the cache before each test (default 0), as llama-bench's -d",
    )
    p.add_argument(
        "-ub",
        "--ubatch-size",
        type=int,
        metavar="N",
        help="prompt tokens a pass takes in the pp tests (default: the backend's prompt piece, "
        "also its most), as llama-bench's -ub",
    )
    p.add_argument(
        "--tg-sync",
        action="store_true",
        help="each tg step waits for the previous token before it starts, as llama-bench's tg "
        "(by default steps run as generation runs them: one ahead where the backend feeds its "
        "picks on the device)",
    )
    p.add_argument("-r", "--repetitions", type=int, default=5, help="timed runs of each test")
    p.add_argument("-o", "--output", choices=FORMATS, default="md", help="output format")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while loading")


def bench(args: Any, ctx: Any) -> int:
    from forge.bench import bench_decode, bench_prefill, prompt_piece
    from forge.cli.generation_flags import load_model

    prompts = [n for n in _counts(args.n_prompt) if n]
    gens = [n for n in _counts(args.n_gen) if n]
    depths = _counts(args.n_depth)
    if args.repetitions < 1:
        raise UsageError("-r/--repetitions must be >= 1")
    if not prompts and not gens:
        raise UsageError("nothing to measure: -p and -n are both 0")
    need = max([*prompts, *(16 + n for n in gens)]) + max(depths)
    if need > ctx.config.n_ctx:
        raise UsageError(f"the tests need {need} positions; raise -c/--ctx-size (now "
                         f"{ctx.config.n_ctx})")  # fmt: skip
    model = load_model(args, ctx)
    if need > model.n_ctx:
        raise UsageError(f"the tests need {need} positions but the model holds {model.n_ctx}")
    ubatch = prompt_piece(model, args.ubatch_size)
    facts = {**model_facts(model), **_where(model, ctx), "n_ubatch": ubatch}
    rows = []
    tests = [(kind, n, d) for d in depths
             for kind, sizes in (("pp", prompts), ("tg", gens)) for n in sizes]  # fmt: skip
    for kind, n, depth in tests:
        if kind == "pp":
            result = bench_prefill(model, n, args.repetitions, depth, ubatch)
        else:
            result = bench_decode(model, n, args.repetitions, depth, args.tg_sync)
        rates = [n / t for t in result.runs_s]
        rows.append(BenchRow(**facts, n_prompt=n if kind == "pp" else 0,
                             n_gen=n if kind == "tg" else 0, n_depth=depth, test=result.test,
                             avg_ts=result.median_tok_s, stddev_ts=result.stdev_tok_s,
                             samples_ts=rates))  # fmt: skip
        if args.output == "jsonl":  # one line per test as it finishes, as llama-bench
            sys.stdout.write(render(rows[-1:], "jsonl"))
            sys.stdout.flush()
    if args.output != "jsonl":
        sys.stdout.write(render(rows, args.output))
    return 0


def _where(model: Any, ctx: Any) -> dict[str, Any]:
    """The backend with its threads (CPU) or its device's name (GPU)."""
    probe = ctx.plugins.probe(model.backend)
    devices = probe.devices or []
    device = devices[ctx.config.device] if ctx.config.device < len(devices) else None
    if device is not None and device.platform != "cpu":
        return {"backend": model.backend, "n_threads": None, "device": device.name}
    return {
        "backend": model.backend,
        "n_threads": ctx.config.threads or os.cpu_count(),
        "device": None,
    }
