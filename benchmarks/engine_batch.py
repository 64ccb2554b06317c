"""Engine-only batching: decode step time of the runner for 1..N sequences, and aggregate
tokens/s of the scheduler with N concurrent greedy requests, without HTTP: all started at once,
and with turnover (each stream's next request starts when its last ends, as load_server's
clients do, so new prompts are prefilled alongside running decoders). Separates what the
engine costs from what `forge serve` adds (compare with benchmarks/load_server.py).

    python benchmarks/engine_batch.py [--model GGUF] [--backend NAME] [--streams 1 8 32]
        [--split-ab] [--requests-per-stream 4]

--split-ab (hip): step times under AB_SETTINGS (decode products of 2-32 rows on mmq.hip's int8
tensor cores, plan.mmq, or on mmv.hip's 8-row kernels with x's rows split over blocks) and
per-kernel event timings of the largest step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import threading
import time

import numpy as np

import forge
from forge.backend import SeqBatch
from forge.scheduler import Finished, Scheduler


@contextlib.contextmanager
def block_tables(model, n: int, positions: int):
    """n sequences' block tables with room for `positions` each, released afterwards."""
    tables = []
    try:
        for _ in range(n):
            tables.append(model.kv.table())  # the full pool and any window pools
            tables[-1].ensure(positions)
        yield tables
    finally:
        for t in tables:
            t.release()


def step_ms(model, n: int, context: int = 32, reps: int = 20) -> float:
    """Median ms of one greedy decode step for n sequences at `context` positions."""
    with block_tables(model, n, context + reps + 2) as tables:
        ids = np.arange(1, context + 1, dtype=np.int32)
        model.runner.forward(
            [SeqBatch(ids, 0, t.array(), "none", t.window_arrays()) for t in tables]
        )
        times = []
        for r in range(reps + 1):
            batch = [
                SeqBatch(np.array([7], np.int32), context + r, t.array(), "last", t.window_arrays())
                for t in tables
            ]
            t0 = time.perf_counter()
            model.runner.forward_argmax(batch)
            times.append(time.perf_counter() - t0)
        return 1e3 * float(np.median(times[1:]))


def step_profile(model, n: int, context: int = 32) -> dict[str, list]:
    """{kernel: [launches, ms]} of one decode step for n sequences (event timings per launch)."""
    with block_tables(model, n, context + 2) as tables:
        ids = np.arange(1, context + 1, dtype=np.int32)
        model.runner.forward(
            [SeqBatch(ids, 0, t.array(), "none", t.window_arrays()) for t in tables]
        )
        batch = [
            SeqBatch(np.array([7], np.int32), context, t.array(), "last", t.window_arrays())
            for t in tables
        ]
        prof = model.runner.profile_decode(batch)
        top = sorted(prof.items(), key=lambda kv: -kv[1][1])
        return {k: [c, round(ms, 4)] for k, (c, ms) in top}


AB_SETTINGS = {  # plan attributes of the --split-ab runs
    "mvq r8 kernels, x rows split over blocks (session 7)": {
        "mmq": False, "mvq_split": True, "mvq_max_work": 128 << 20, "att_fill": None},
    "mmq: 2-32 rows on int8 tensor cores, attention splits up to the KV capacity": {
        "mmq": True, "att_fill": None},
    "mmq, attention splits within 2 blocks per compute unit": {"mmq": True, "att_fill": 2},
    "mmq, attention splits within 1 block per compute unit": {"mmq": True, "att_fill": 1},
}  # fmt: skip


def step_shares(model, n: int, context: int = 130) -> dict:
    """gpu_bench.decode_shares for a step of n sequences: each kernel group's cost inside the
    replayed graph (left out, the step's time drops by that much)."""
    from gpu_bench import decode_shares  # benchmarks/ is the script's directory

    with block_tables(model, n, context) as tables:
        return decode_shares(model.runner, [t.array() for t in tables])


def split_ab(model, streams: list[int]) -> dict:
    """Step ms per stream count under each of AB_SETTINGS, the largest step's kernels (event
    timings of single launches) and its kernel groups' cost in the graph (step_shares)."""
    plan, out = model.runner.plan, {}
    defaults = {k: getattr(plan, k) for s in AB_SETTINGS.values() for k in s}
    try:
        for label, setting in AB_SETTINGS.items():
            for k, v in {**defaults, **setting}.items():
                setattr(plan, k, v)
            model.runner.graphs.clear()
            out[label] = {
                "step_ms": {n: round(step_ms(model, n), 3) for n in streams},
                "kernels": step_profile(model, max(streams)),
                "shares_us": step_shares(model, max(streams)),
            }
    finally:
        for k, v in defaults.items():
            setattr(plan, k, v)
        model.runner.graphs.clear()
    return out


def scheduler_tok_s(model, streams: int, max_tokens: int) -> float:
    sched = Scheduler(model, max_batch=max(streams, 1)).start()
    try:
        qs = []
        t0 = time.perf_counter()
        for i in range(streams):
            q: queue.Queue = queue.Queue()
            state = model.start(f"Request {i}: tell a story about", max_tokens=max_tokens,
                                temperature=0)  # fmt: skip
            sched.submit(state, q.put)
            qs.append((q, state))
        tokens = 0
        for q, state in qs:
            while not isinstance(q.get(timeout=600), Finished):
                pass
            tokens += len(state.generated)
        return tokens / (time.perf_counter() - t0)
    finally:
        sched.stop(10)


def scheduler_turnover_tok_s(model, streams: int, max_tokens: int, requests: int) -> float:
    """Like load_server's clients without HTTP: each of `streams` submits its next request (a
    different prompt) the moment its previous one finishes, `requests` times; new prompts are
    prefilled in steps shared with the running decoders."""
    sched = Scheduler(model, max_batch=max(streams, 1), max_queue=4 * streams).start()
    done = threading.Event()
    left = [requests] * streams
    counts = {"tokens": 0, "open": streams}
    lock = threading.Lock()

    def submit(i: int) -> None:
        left[i] -= 1
        prompt = f"Stream {i} request {requests - left[i]}: tell a story about"
        state = model.start(prompt, max_tokens=max_tokens, temperature=0)
        sched.submit(state, lambda m: finished(i, state) if isinstance(m, Finished) else None)

    def finished(i: int, state) -> None:  # the scheduler thread
        with lock:
            counts["tokens"] += len(state.generated)
            if left[i] > 0:
                submit(i)
                return
            counts["open"] -= 1
            if counts["open"] == 0:
                done.set()

    try:
        t0 = time.perf_counter()
        with lock:
            for i in range(streams):
                submit(i)
        if not done.wait(600):
            raise TimeoutError("turnover run did not finish")
        return counts["tokens"] / (time.perf_counter() - t0)
    finally:
        sched.stop(10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model")
    p.add_argument("--backend")
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--n-ctx", type=int, default=8192)
    p.add_argument("--split-ab", action="store_true")
    p.add_argument("--requests-per-stream", type=int, default=4,
                   help="turnover run: requests each stream makes one after another")  # fmt: skip
    args = p.parse_args()
    model = forge.load(args.model, backend=args.backend, n_ctx=args.n_ctx)
    if args.split_ab:
        ab = split_ab(model, args.streams)
        print(json.dumps(ab, indent=2))
        for key, r in ab.items():
            steps = " ".join(f"{n}: {ms:.3f}" for n, ms in r["step_ms"].items())
            print(f"{key}: step ms {steps}")
            print("  in-graph us: " + ", ".join(f"{k} {v}" for k, v in r["shares_us"].items()))
    rows = []
    for n in args.streams:
        ms = step_ms(model, n)
        tok_s = scheduler_tok_s(model, n, args.max_tokens)
        turn = scheduler_turnover_tok_s(model, n, args.max_tokens, args.requests_per_stream)
        rows.append({"streams": n, "step_ms": round(ms, 3), "step_tok_s": round(n * 1e3 / ms, 1),
                     "scheduler_tok_s": round(tok_s, 1),
                     "turnover_tok_s": round(turn, 1)})  # fmt: skip
    base, base_turn = rows[0]["scheduler_tok_s"], rows[0]["turnover_tok_s"]
    for r in rows:
        r["scheduler_x"] = round(r["scheduler_tok_s"] / base, 2)
        r["turnover_x"] = round(r["turnover_tok_s"] / base_turn, 2)
    print(json.dumps({"backend": model.backend, "rows": rows}, indent=2))
    print(f"\n{'streams':>7} {'step ms':>8} {'step tok/s':>10} {'sched tok/s':>11} {'x':>6} "
          f"{'turnover tok/s':>14} {'x':>6}")  # fmt: skip
    for r in rows:
        print(f"{r['streams']:>7} {r['step_ms']:>8.2f} {r['step_tok_s']:>10.1f} "
              f"{r['scheduler_tok_s']:>11.1f} {r['scheduler_x']:>6.2f} "
              f"{r['turnover_tok_s']:>14.1f} {r['turnover_x']:>6.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
