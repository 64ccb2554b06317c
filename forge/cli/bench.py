"""``forge bench [MODEL]``: prefill and generation throughput (like llama-bench)."""

from __future__ import annotations

import json
import platform
import sys
import time
from typing import Any

from forge.cli.common import add_command, print_table

ORDER = 30


def add_parser(subparsers: Any) -> None:
    p = add_command(subparsers, "bench", bench, "measure prefill and generation speed")
    p.add_argument("model_path", nargs="?", metavar="MODEL", help="GGUF file (default model)")
    p.add_argument("-p", "--n-prompt", type=int, default=128, help="prompt tokens (pp test)")
    p.add_argument("-n", "--n-gen", type=int, default=32, help="generated tokens (tg test)")
    p.add_argument("-r", "--repetitions", type=int, default=3, help="timed runs of each test")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def bench(args: Any, ctx: Any) -> int:
    from forge.bench import bench_decode, bench_prefill
    from forge.cli.run import load_model
    from forge.errors import UsageError

    if min(args.n_prompt, args.n_gen, args.repetitions) < 1:
        raise UsageError("--n-prompt, --n-gen and --repetitions must be >= 1")
    t0 = time.perf_counter()
    model = load_model(args, ctx)
    load_s = time.perf_counter() - t0
    need = max(args.n_prompt, 16 + args.n_gen)
    if need > model.n_ctx:
        raise UsageError(f"the tests need {need} positions; raise --n-ctx (now {model.n_ctx})")
    results = [
        bench_prefill(model, args.n_prompt, args.repetitions),
        bench_decode(model, args.n_gen, args.repetitions),
    ]
    info = {
        "model": model.path,
        "arch": model.spec.arch,
        "backend": model.backend,
        "machine": platform.machine(),
        "load_s": round(load_s, 3),
        "results": [r.as_dict() for r in results],
    }
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        print()
    else:
        rows = [
            (model.spec.name or model.spec.arch, model.backend, r.test,
             f"{r.median_tok_s:.1f} ± {r.stdev_tok_s:.1f}")
            for r in results
        ]  # fmt: skip
        print_table(("model", "backend", "test", "t/s"), rows)
        print(f"load {load_s:.2f} s", file=sys.stderr)
    return 0
