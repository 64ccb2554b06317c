"""Mixture-of-experts speed on hip: a shape twin of Qwen3-30B-A3B Q4_K_M (benchmarks/specs,
built here by benchmarks/moe_twin.py on first use) decoding one sequence (tg128), prefilling 512
tokens (pp512) and decoding 32 sequences at once; the decode figure against the active-parameter
floor (the dense weights plus the chosen experts' bytes per token over the measured copy
bandwidth) and the decode step's time per kernel group and per launch slot of a layer (in the
captured graph, gpu_bench.decode_shares).

  python benchmarks/gpu_moe.py [--spec SPEC.json.gz] [--work DIR] [--out DIR] [--generic-experts]
                               [--decode-only | --prefill-only] [--prefill-tiles V] [--prompt N]

--generic-experts: the expert kernels for every weight type instead of the one-type decode
kernels (forge_hip.experts.kernel), for comparison. --decode-only: the one-sequence decode
figures only (no prefill, no batched decode), e.g. to compare tuning files (FORGE_HIP_TUNING).
--prefill-only: the prefill figure and its kernels' times only. --prefill-tiles V: passes of more
than 8 pairs an expert take expert variant V (mma, gemm64 or gemm128) instead of the one
forge_hip.experts.variant picks, for comparison. --prompt N: prefill N tokens (default 512, at
most 512: one pass).

Prints a short table; writes gpu_moe.json (with --generic-experts gpu_moe_generic.json) under
--out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_bench import (  # noqa: E402
    batched_decode,
    copy_bandwidth,
    decode_fed,
    decode_shares,
    whole_cache,
)

DEFAULT_SPEC = ROOT / "benchmarks" / "specs" / "qwen3_30b_a3b_q4_k_m.spec.json.gz"
BLOCK = 16  # KV block size of the tables made here
PREFILL_TILES = ("mma", "gemm64", "gemm128")  # the expert variants of passes past 8 pairs an expert


def twin(spec: Path, work: Path) -> Path:
    out = work / (spec.name.replace(".spec.json.gz", "") + "-twin.gguf")
    if not out.exists():
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "moe_twin.py"), str(spec),
                        str(out), "--tool", str(ROOT / "scripts" / "gguf_twin.py")],
                       check=True)  # fmt: skip
        print(f"built {out.name} in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def active_bytes(spec, gguf) -> tuple[int, int]:
    """(bytes all weights but the embedding, bytes one token reads: the dense ones and
    n_expert_used / n_expert of every expert tensor)."""
    from forge.models.weights import model_weights

    f = spec.ffn
    total = active = 0
    for name in model_weights(spec):
        if name == "token_embd.weight" and not spec.tied_output:
            continue
        nbytes = gguf.tensors[name].nbytes
        total += nbytes
        active += nbytes * f.n_expert_used // f.n_expert if "_exps." in name else nbytes
    return total, active


def force_prefill_tiles(v: str) -> None:
    """Passes of more than 8 pairs an expert take expert variant v (the tensor-core tiles); the
    16-bit ones only where gate and up share a type (a gated tile decodes one)."""
    from forge_hip import experts

    chosen = experts.variant

    def variant(types, pairs, n_expert):
        picked = chosen(types, pairs, n_expert)
        fits = v == "mma" or types[0] == types[1]
        return v if picked in PREFILL_TILES and fits else picked

    experts.variant = variant


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")))
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--generic-experts", action="store_true")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--decode-only", action="store_true")
    only.add_argument("--prefill-only", action="store_true")
    ap.add_argument("--prefill-tiles", choices=PREFILL_TILES)
    ap.add_argument("--prompt", type=int, default=512, choices=range(1, 513), metavar="N")
    args = ap.parse_args()
    if args.prefill_tiles:
        force_prefill_tiles(args.prefill_tiles)

    import forge
    from forge.backend import SeqBatch

    path = twin(args.spec, args.work)
    t0 = time.perf_counter()
    model = forge.load(str(path), backend="hip", n_ctx=8192)
    load_s = time.perf_counter() - t0
    whole_cache(model)
    runner, spec = model.runner, model.spec
    runner.plan.ffns.typed = not args.generic_experts
    bandwidth = copy_bandwidth(runner.rt)
    rng = np.random.default_rng(0)
    plen = args.prompt
    prompt = rng.integers(1, spec.n_vocab, size=plen).astype(np.int32)
    table = np.arange(1024 // BLOCK, dtype=np.int32)

    def prefill() -> float:
        t = time.perf_counter()
        runner.forward([SeqBatch(prompt, 0, table, "last")])
        return time.perf_counter() - t

    prefill()  # warm-up (kernel compiles)
    pp, pprof = float("nan"), {}
    if not args.decode_only:
        pp = min(prefill() for _ in range(3))
        runner.launch.start_profile()
        prefill()
        pprof = runner.launch.stop_profile()

    def decode_ahead(n: int) -> float:
        return decode_fed(runner, prompt, table, n)

    tg, prof, shares = float("nan"), {}, {}
    if not args.prefill_only:
        decode_ahead(8)
        tg = min(decode_ahead(128) for _ in range(3))
        prof = runner.profile_decode([SeqBatch(np.array([7], np.int32), 128, table)])
        shares = decode_shares(runner, table, by_slot=True)

    b, tb = args.batch, float("nan")
    if not args.decode_only and not args.prefill_only:
        batched_decode(runner, spec.n_vocab, b, 4, rng)
        tb = min(batched_decode(runner, spec.n_vocab, b, 64, rng) for _ in range(2))
    total, active = active_bytes(spec, model.gguf)
    tok_s = 128 / tg
    result = {
        "model": path.name,
        "expert_kernels": "generic" if args.generic_experts else "one-type where available",
        "prefill_tiles": args.prefill_tiles or "chosen",
        "device": runner.rt.props.name,
        "load_s": round(load_s, 1),
        "copy_bandwidth_GBs": round(bandwidth / 1e9, 1),
        "weight_bytes": total,
        "active_bytes_per_token": active,
        "decode_tg128_tok_s": round(tok_s, 1),
        "decode_floor_tok_s": round(bandwidth / active, 1),
        "decode_share_of_floor": round(tok_s * active / bandwidth, 3),
        f"prefill_pp{plen}_tok_s": None if args.decode_only else round(plen / pp, 1),
        f"batched_decode_{b}_seqs_tok_s": None if args.decode_only else round(b * 64 / tb, 1),
        "decode_step_us_by_group": shares,
        "decode_step_kernel_ms": {
            k: [n, round(ms, 4)] for k, (n, ms) in sorted(prof.items(), key=lambda kv: -kv[1][1])
        },  # fmt: skip
        "prefill_kernel_ms": {
            k: [n, round(ms, 3)] for k, (n, ms) in sorted(pprof.items(), key=lambda kv: -kv[1][1])
        },  # fmt: skip
    }
    runner.close()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        name = "gpu_moe_generic.json" if args.generic_experts else "gpu_moe.json"
        part = "_decode" if args.decode_only else "_prefill" if args.prefill_only else ""
        tiles = f"_{args.prefill_tiles}" if args.prefill_tiles else ""
        name = name.replace(".json", f"{part}{tiles}.json")
        (Path(args.out) / name).write_text(json.dumps(result, indent=1))
    print(f"| model | tg128 | floor | pp{plen} | {b} seqs |\n|---|---|---|---|---|")
    print(f"| {path.name} | {tok_s:.1f} tok/s | {bandwidth / active:.0f} tok/s "
          f"({100 * tok_s * active / bandwidth:.0f}%) | {plen / pp:.0f} tok/s | "
          f"{b * 64 / tb:.0f} tok/s |")  # fmt: skip
    print("decode step (us, in the graph):", ", ".join(f"{k} {v}" for k, v in shares.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
