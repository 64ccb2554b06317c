"""forge's cpu_simd backend against llama.cpp on the same machine, in the same run.

Default model (Gemma 3 270M Q4_K_M), each engine in a fresh process per run, runs alternated
(forge, llama.cpp, forge, ...): prefill of a 128-token prompt, then a 179-token prompt followed by
64 greedy tokens (decode rate over the 63 steps after the first token). Also: forge's peak RSS, the
GGUF bytes one decode token reads, the machine's read bandwidth and the memory floor they give.
Prints JSON, then a short table.

    python benchmarks/cpu_vs_llama.py --llama-python /path/to/venv/bin/python [--runs 3]
        [--threads 2] [--kernels auto|builtin] [--json-out FILE]

llama.cpp comes from llama-cpp-python in a separate virtual environment (not a forge dependency),
built from source with AMX off, e.g.
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON
    -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"
    pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36
Without --llama-python only forge is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based inks and a wooden press adapted from those used for "
    "wine. Before that, books were copied by hand, and a single volume could take a scribe many "
    "months. The new machines spread quickly across Europe: by 1500 more than two hundred and "
    "fifty cities had a print shop, and millions of copies of books, pamphlets and broadsheets "
    "were in circulation. Scholars could compare identical texts, merchants printed price lists, "
    "and reformers reached readers far beyond their own towns. Over the following centuries "
    "presses grew faster and larger, powered first by steam and later by electricity, until "
    "newspapers could print hundreds of thousands of copies in a single night. Today most text is "
    "read on screens, yet the basic idea of reproducing the same words many times remains at the "
    "heart of every publishing system, from the largest newspapers to the smallest blogs. "
) * 3

FORGE = r"""
import json, resource, sys, time
import numpy as np
import forge
args = json.loads(sys.argv[1])
t0 = time.perf_counter()
m = forge.load(backend="cpu_simd", n_ctx=512, config={"kernels": args["kernels"],
                                                      "threads": args["threads"]})
load_s = time.perf_counter() - t0
ids = m.tokenize(args["text"])
short, long = ids[:args["prefill"]], ids[:args["prompt"]]
eog = getattr(m.tokenizer, "eog_ids", ())
ban = {int(t): float("-inf") for t in eog}
m.complete(short, max_tokens=1, temperature=0)  # warm up (first-call allocations)
c = m.complete(short, max_tokens=1, temperature=0)
prefill = len(short) / c.prompt_seconds
c = m.complete(long, max_tokens=args["gen"], temperature=0, logit_bias=ban)
decode = (len(c.tokens) - 1) / c.generation_seconds
print(json.dumps({"load_s": load_s, "prefill_tok_s": prefill, "decode_tok_s": decode,
                  "generated": len(c.tokens),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

LLAMA = r"""
import json, sys, time
import numpy as np
import llama_cpp
args = json.loads(sys.argv[1])
t0 = time.perf_counter()
llm = llama_cpp.Llama(args["path"], n_ctx=512, n_threads=args["threads"],
                      n_threads_batch=args["threads"], n_batch=512, verbose=False)
load_s = time.perf_counter() - t0
ids = llm.tokenize(args["text"].encode())
short, long = ids[:args["prefill"]], ids[:args["prompt"]]

def prefill_s(tokens):
    llm.reset()
    t = time.perf_counter()
    llm.eval(tokens)
    return time.perf_counter() - t

prefill_s(short)  # warm up
prefill = len(short) / prefill_s(short)
prefill_s(long)
tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
t = time.perf_counter()
for _ in range(args["gen"] - 1):
    llm.eval([tok])
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
decode = (args["gen"] - 1) / (time.perf_counter() - t)
print(json.dumps({"load_s": load_s, "prefill_tok_s": prefill, "decode_tok_s": decode}))
"""

BANDWIDTH = r"""
import json, sys, threading, time
import numpy as np
from numba import njit

@njit(nogil=True, cache=False)
def total(a):
    s = np.uint64(0)
    for i in range(a.size):
        s += a[i]
    return s

threads = int(sys.argv[1])
a = np.ones(1 << 27, np.uint64)  # 1 GiB
total(a[:8])
best = 0.0
for _ in range(5):
    parts = np.array_split(a, threads)
    ts = [threading.Thread(target=total, args=(p,)) for p in parts]
    t = time.perf_counter()
    for th in ts: th.start()
    for th in ts: th.join()
    best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
print(json.dumps({"read_gb_s": best}))
"""


def _run(python: str, code: str, args: dict) -> dict:
    done = subprocess.run([python, "-c", code, json.dumps(args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"{python} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _decode_bytes(path: str) -> int:
    """GGUF bytes of the matrices one decode token multiplies by (every layer and the head)."""
    from forge_cpu_simd.loading import matrix_names

    import forge
    from forge.gguf import open_gguf
    from forge.models import build_spec

    gguf = open_gguf(path)
    spec = build_spec(gguf)
    del forge
    return sum(
        gguf.tensors[n].nbytes for n in matrix_names(spec) if len(gguf.tensors[n].shape) == 2
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-python", help="python of a venv with llama-cpp-python")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kernels", default="auto", choices=["auto", "builtin"])
    ap.add_argument("--json-out")
    a = ap.parse_args()

    from forge.api import default_model_path

    path = default_model_path()
    args = {"path": path, "text": TEXT, "prefill": 128, "prompt": 179, "gen": 64,
            "threads": a.threads, "kernels": a.kernels}  # fmt: skip
    runs: dict[str, list[dict]] = {"forge": [], "llama.cpp": []}
    for i in range(a.runs):
        runs["forge"].append(_run(sys.executable, FORGE, args))
        print(f"run {i + 1} forge     {runs['forge'][-1]}", file=sys.stderr)
        if a.llama_python:
            runs["llama.cpp"].append(_run(a.llama_python, LLAMA, args))
            print(f"run {i + 1} llama.cpp {runs['llama.cpp'][-1]}", file=sys.stderr)
    bandwidth = json.loads(subprocess.run([sys.executable, "-c", BANDWIDTH, str(a.threads)],
                                          capture_output=True, text=True, check=True).stdout
                           )["read_gb_s"]  # fmt: skip
    per_token = _decode_bytes(path)
    floor = bandwidth * 1e9 / per_token

    def span(engine: str, key: str) -> list[float]:
        return [r[key] for r in runs[engine]]

    result = {
        "model": os.path.basename(path), "threads": a.threads, "kernels": a.kernels,
        "runs": runs, "read_bandwidth_gb_s": bandwidth, "gguf_bytes_per_token": per_token,
        "memory_floor_tok_s": floor,
    }  # fmt: skip
    f_dec, f_pre = span("forge", "decode_tok_s"), span("forge", "prefill_tok_s")
    result["forge_decode_share_of_floor"] = statistics.median(f_dec) / floor
    if runs["llama.cpp"]:
        l_dec, l_pre = span("llama.cpp", "decode_tok_s"), span("llama.cpp", "prefill_tok_s")
        result["decode_ratio"] = statistics.median(f_dec) / statistics.median(l_dec)
        result["prefill_ratio"] = statistics.median(f_pre) / statistics.median(l_pre)
    print(json.dumps(result, indent=2))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(result, f, indent=2)

    def fmt(values: list[float], unit: str) -> str:
        return f"{min(values):.1f}-{max(values):.1f} {unit}" if values else "-"

    rows = [("decode (179-token prompt, 64 tokens)", "decode_tok_s", "tok/s"),
            ("prefill, 128-token prompt", "prefill_tok_s", "tok/s")]  # fmt: skip
    print(f"\n{'':40s} {'forge cpu_simd':>20s} {'llama.cpp':>20s}  ratio (medians)")
    for name, key, unit in rows:
        f, ll = span("forge", key), span("llama.cpp", key)
        ratio = f"{statistics.median(f) / statistics.median(ll):.2f}x" if ll else "-"
        print(f"{name:40s} {fmt(f, unit):>20s} {fmt(ll, unit):>20s}  {ratio}")
    print(f"{'forge peak RSS':40s} {fmt(span('forge', 'peak_rss_mb'), 'MB'):>20s}")
    print(
        f"{'memory floor':40s} {floor:>14.1f} tok/s  ({per_token / 1e6:.0f} MB/token at "
        f"{bandwidth:.1f} GB/s; forge decode at {result['forge_decode_share_of_floor']:.0%})"
    )


if __name__ == "__main__":
    main()
