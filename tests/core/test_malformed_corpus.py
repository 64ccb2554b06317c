"""~225 malformed model files (tests/support/malformed.py) through the whole load path, each in a
worker process with an address-space limit and a time limit per file: every one either loads and
generates, or fails with a ForgeError (a clear message, no traceback), within the limits."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support.gguf_factory import tiny_model
from tests.support.malformed import write_corpus

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses RLIMIT_AS and /proc")

ROOT = Path(__file__).resolve().parents[2]
MEMORY_MIB = 1024  # address space a case may add to the worker's (the limit that stops it)
PEAK_MIB = 64  # traced allocations a case may reach (what it really costs)
CASE_TIMEOUT_S = 20  # per file (a FIFO used to block forever)


class Worker:
    def __init__(self, warmup: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.load_worker", str(MEMORY_MIB), str(warmup)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip

    def run(self, path: Path) -> dict | None:
        """The worker's report on `path`, or None if it gave none within the time limit."""
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], CASE_TIMEOUT_S + 60 * self.first)
        self.first = False
        line = self.proc.stdout.readline() if ready else ""
        return json.loads(line) if line else None

    first = True  # the first case also waits for the warm-up

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def test_every_malformed_file_is_a_forge_error_within_limits(tmp_path, golden_dir):
    cases = write_corpus(tmp_path / "corpus", golden_dir)
    assert 215 <= len(cases) <= 235
    warmup = tiny_model(tmp_path / "warmup.gguf")
    worker = Worker(warmup)
    outcomes: Counter = Counter()
    failures = []
    started = time.monotonic()
    try:
        for label, path in cases:
            report = worker.run(path)
            if report is None:
                failures.append(f"{label}: no result within {CASE_TIMEOUT_S} s")
                worker.kill()
                worker = Worker(warmup)
                continue
            outcomes[report["outcome"]] += 1
            if report["outcome"] != "loaded" and not report["outcome"].endswith("Error"):
                failures.append(f"{label}: {report['outcome']}: {report['error']}")
            elif report["outcome"].startswith("BUG"):
                failures.append(f"{label}: {report['outcome']}: {report['error']}")
            if report["peak_mib"] > PEAK_MIB:
                failures.append(f"{label}: allocated {report['peak_mib']} MiB")
    finally:
        worker.kill()
    print(f"\n{len(cases)} malformed files in {time.monotonic() - started:.1f} s: {dict(outcomes)}")
    assert not failures, "\n".join(failures[:30])
    # the corpus reaches every stage: the reader, the spec checks, and files that still run
    assert outcomes["GGUFFormatError"] >= 15 and outcomes["ModelError"] >= 100
    assert outcomes["loaded"] >= 10
