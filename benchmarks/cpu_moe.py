"""cpu_simd on a mixture-of-experts GGUF (a shape twin from moe_twin.py, or a real file): load
time, prefill and decode speed, resident memory and how many experts were prepared. Prints JSON,
then a short table.

  python benchmarks/moe_twin.py benchmarks/specs/gpt_oss_20b_mxfp4.spec.json.gz /tmp/t.gguf \\
      --layers 2
  python benchmarks/cpu_moe.py /tmp/t.gguf [-p 64] [-n 16]
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("-p", type=int, default=64, help="prompt tokens (random ids)")
    ap.add_argument("-n", type=int, default=16, help="tokens to decode")
    args = ap.parse_args()

    from forge_cpu_simd.experts import ExpertFFNBlock

    import forge

    t0 = time.perf_counter()
    model = forge.load(args.model, backend="cpu_simd", n_ctx=args.p + args.n + 8)
    load_s = time.perf_counter() - t0
    ids = np.random.default_rng(0).integers(0, model.n_vocab, args.p).tolist()
    no_end = {t: float("-inf") for t in model.tokenizer.eog_ids}  # decode all n tokens
    out = model.complete(ids, max_tokens=args.n, temperature=0, logit_bias=no_end)
    blocks = [ffn for _, ffn in model.runner.blocks if isinstance(ffn, ExpertFFNBlock)]
    result = {
        "model": args.model,
        "arch": model.spec.arch,
        "layers": model.spec.n_layer,
        "load_s": round(load_s, 2),
        "pp_tokens_per_s": round(args.p / out.prompt_seconds, 2),
        "tg_tokens_per_s": round(len(out.tokens) / out.generation_seconds, 2),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "experts_prepared": sum(b.cache.prepared for b in blocks),
        "expert_cache_mib": sum(b.cache.nbytes for b in blocks) >> 20,
    }
    print(json.dumps(result))
    for key, value in result.items():
        print(f"{key:18s} {value}")


if __name__ == "__main__":
    main()
