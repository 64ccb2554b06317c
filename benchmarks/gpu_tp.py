"""Tensor-parallel speed on hip: a Llama-3 shape twin (8B or 70B, Q4_K_M; built here from
benchmarks/specs with scripts/gguf_twin.py) on 1, 2, ... GPUs of this host: decode tg128 (one
sequence, greedy, a step per call as the engine runs it), prefill pp512 and 32 sequences
decoding together; the decode figure against the bandwidth floor (the weights one token reads
over the GPUs' summed copy bandwidth, measured on GPU 0).

  python benchmarks/gpu_tp.py [--model llama8b|llama70b] [--tp 1,2] [--work DIR] [--out DIR]

Prints a short table; writes gpu_tp_<model>.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_bench import (  # noqa: E402
    batched_decode,
    bytes_per_token,
    copy_bandwidth,
    model_path,
    whole_cache,
)

BLOCK = 16  # KV block size of the tables made here


def measure(path: str, tp: int, batch: int) -> dict:
    import forge
    from forge.backend import SeqBatch

    t0 = time.perf_counter()
    model = forge.load(path, backend="hip", n_ctx=8192, config={"tensor_parallel": tp})
    load_s = time.perf_counter() - t0
    whole_cache(model)
    runner, spec = model.runner, model.spec
    rng = np.random.default_rng(0)
    prompt = rng.integers(1, spec.n_vocab, size=512).astype(np.int32)
    table = np.arange(1024 // BLOCK, dtype=np.int32)
    try:

        def prefill() -> float:
            t = time.perf_counter()
            runner.forward([SeqBatch(prompt, 0, table, "last")])
            return time.perf_counter() - t

        def decode(n: int) -> float:
            tok, t = 7, time.perf_counter()
            for i in range(n):
                tok = runner.forward_argmax([SeqBatch(np.array([tok], np.int32), 512 + i,
                                                      table)])[0]  # fmt: skip
            return time.perf_counter() - t

        prefill()  # warm-up: kernel compiles, graph captures
        pp = min(prefill() for _ in range(3))
        decode(8)
        tg = min(decode(128) for _ in range(2))
        batched_decode(runner, spec.n_vocab, batch, 4, rng)
        tb = min(batched_decode(runner, spec.n_vocab, batch, 32, rng) for _ in range(2))
        bandwidth = copy_bandwidth(runner.rt) if tp == 1 else None
        return {"tp": tp, "load_s": round(load_s, 1), "tg128_tok_s": round(128 / tg, 1),
                "pp512_tok_s": round(512 / pp, 1),
                f"batched_{batch}_tok_s": round(batch * 32 / tb, 1),
                "copy_bandwidth_GBs": bandwidth and round(bandwidth / 1e9, 1),
                "devices": [s.device_name for s in runner.placement.shards]}  # fmt: skip
    finally:
        runner.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama8b", choices=["llama8b", "llama70b"])
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")))
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    from forge.gguf import open_gguf
    from forge.models import build_spec

    path, label = model_path(args.model, args.work)
    gguf = open_gguf(path)
    per_token = bytes_per_token(build_spec(gguf), gguf)
    rows = []
    for tp in args.tp.split(","):  # each run's line as it ends (a long run may be cut short)
        rows.append(measure(path, int(tp), args.batch))
        print(json.dumps(rows[-1]), flush=True)
    bw = next((r["copy_bandwidth_GBs"] for r in rows if r["copy_bandwidth_GBs"]), None)
    for r in rows:
        if bw:
            r["decode_floor_tok_s"] = round(r["tp"] * bw * 1e9 / per_token, 1)
            r["decode_share_of_floor"] = round(r["tg128_tok_s"] / r["decode_floor_tok_s"], 3)
    result = {"model": label, "bytes_per_token": per_token, "runs": rows}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"gpu_tp_{args.model}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    print(f"| {label} | tg128 | floor | pp512 | {args.batch} seqs |\n|---|---|---|---|---|")
    for r in rows:
        floor = f"{r['decode_floor_tok_s']:.0f} ({100 * r['decode_share_of_floor']:.0f}%)" if bw \
            else "-"  # fmt: skip
        print(f"| TP={r['tp']} | {r['tg128_tok_s']} tok/s | {floor} | {r['pp512_tok_s']} tok/s "
              f"| {r[f'batched_{args.batch}_tok_s']} tok/s |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
