"""A worker process for the malformed-file tests: it runs the whole load path on each file it is
given, under an address-space limit, and reports one JSON line per file.

Run as ``python -m tests.support.load_worker MEMORY_MIB`` from the repository root; it reads
file paths from stdin (one per line) and writes {"outcome", "error", "peak_mib"} per path, where
outcome is "loaded", the name of the ForgeError raised, or "BUG <exception>" for anything else.
The load path: `forge inspect --json`, `open_gguf`, `build_spec`, the tokenizer, `forge.load` on
cpu_simd and a two-token greedy completion.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import sys
import tracemalloc
import warnings


def _load_path(path: str) -> str:
    import forge
    from forge.cli import main as cli
    from forge.errors import ForgeError
    from forge.gguf import open_gguf
    from forge.models import build_spec
    from forge.tokenizer import tokenizer_from_metadata

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        cli(["inspect", path, "--json", "--backend", "cpu_simd"])
    if "internal error" in err.getvalue():
        return "BUG forge inspect: " + err.getvalue()[-300:]
    try:
        g = open_gguf(path)
        build_spec(g)
        tok = tokenizer_from_metadata(g.metadata)
        tok.decode(tok.encode("ab a b"))
        model = forge.load(path, backend="cpu_simd", n_ctx=64)
        model.complete("ab", max_tokens=2, temperature=0)
        model.close()
        return "loaded"
    except ForgeError as e:
        return f"{type(e).__name__}: {e}"


def main() -> None:
    memory = int(sys.argv[1]) << 20
    warnings.simplefilter("ignore")
    from forge.cli.common import setup_logging

    setup_logging("error")
    _load_path(sys.argv[2])  # warm up: imports, plugins, thread pools
    with open("/proc/self/status") as f:
        vm = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + memory, vm + memory))
    tracemalloc.start()
    for line in sys.stdin:
        tracemalloc.reset_peak()
        try:
            outcome = _load_path(line.rstrip("\n"))
        except BaseException as e:  # noqa: BLE001 - reported: the test fails on it
            outcome = f"BUG {type(e).__name__}: {e}"
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        kind, _, error = outcome.partition(": ")
        print(json.dumps({"outcome": kind, "error": error[:300], "peak_mib": round(peak, 1)}),
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
