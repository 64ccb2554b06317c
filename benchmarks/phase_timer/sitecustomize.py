"""Where a scheduler step's time goes, in any process that runs forge's scheduler (`forge serve`,
its engine child, benchmarks/engine_batch.py), without changing forge.

Put this folder first on PYTHONPATH and name a log file; Python imports this module at startup:

    PYTHONPATH=benchmarks/phase_timer:$PYTHONPATH FORGE_PHASE_LOG=/tmp/phases.log \\
        python benchmarks/load_server.py --model x.gguf --backend hip --levels 1 32

Every 500 scheduler steps one line is appended: wall ms per step, then ms per step spent in
each wrapped method (Scheduler._collect / _plan / _start / _start_ahead / _take / _advance, and
with the hip plugin HipRunner.start_sample / _prepare, RowMeta.upload, GraphCache.run, and
"gpu_wait": the host blocked on a step's picked ids, CudaRuntime.wait; nested calls count in
both), then each thread's share of a core (from /proc/self/task). Unset FORGE_PHASE_LOG:
nothing is changed.
"""

from __future__ import annotations

import os
import threading
import time

LOG = os.environ.get("FORGE_PHASE_LOG")
EVERY = 500  # steps per line


def _cpu_seconds() -> dict[str, float]:
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[names.get(int(tid), tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _install(log: str) -> None:
    import forge.scheduler as scheduler

    spent: dict[str, float] = {}
    last = [time.perf_counter(), _cpu_seconds(), 0]

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t

        return wrapper

    def report() -> None:
        now, cpu = time.perf_counter(), _cpu_seconds()
        wall = now - last[0]
        phases = " ".join(f"{k}={v * 1e3 / EVERY:.3f}" for k, v in sorted(spent.items()))
        shares = " ".join(f"{k}={(v - last[1].get(k, 0.0)) / wall:.2f}"
                          for k, v in sorted(cpu.items(), key=str)
                          if v - last[1].get(k, 0.0) > 0.01 * wall)  # fmt: skip
        with open(log, "a") as f:
            f.write(f"steps {last[2]} ms/step={wall * 1e3 / EVERY:.3f} {phases} | cpu {shares}\n")
        spent.clear()
        last[0], last[1] = now, cpu

    for name in ("_collect", "_plan", "_start", "_start_ahead", "_take"):
        setattr(scheduler.Scheduler, name, timed(name, getattr(scheduler.Scheduler, name)))
    advance = timed("_advance", scheduler.Scheduler._advance)

    def counted(self, started):
        out = advance(self, started)
        last[2] += 1
        if last[2] % EVERY == 0:
            report()
        return out

    scheduler.Scheduler._advance = counted
    try:
        import forge_hip.executor as executor
        import forge_hip.kv as kv
        import forge_hip.runner as runner
    except ImportError:  # no hip plugin here
        return
    runner.HipRunner.start_sample = timed("start_sample", runner.HipRunner.start_sample)
    runner.HipRunner._prepare = timed("prepare", runner.HipRunner._prepare)
    kv.RowMeta.upload = timed("upload", kv.RowMeta.upload)
    executor.GraphCache.run = timed("graph_run", executor.GraphCache.run)
    try:
        from forge_hip.runtime.nvidia import CudaRuntime
    except ImportError:  # no cuda-python here
        return
    CudaRuntime.wait = timed("gpu_wait", CudaRuntime.wait)


if LOG:
    _install(LOG)
