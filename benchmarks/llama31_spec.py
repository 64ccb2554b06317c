"""The Llama-3.1-8B shape spec for scripts/gguf_twin.py, made from the Llama-3-8B one
(benchmarks/specs/llama8b.spec.json.gz): a 131,072-position context and Llama 3.1's RoPE scaling
as llama.cpp's converter stores it, a `rope_freqs` tensor of per-pair frequency divisors
(factor 8, low/high frequency factors 1 and 4 over 8,192 original positions: Meta's published
Llama 3.1 configuration), written with its values so the twin rotates as the real model does.

  python benchmarks/llama31_spec.py    # writes benchmarks/specs/llama31_8b.spec.json.gz
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

SPECS = Path(__file__).parent / "specs"
CONTEXT = 131072
FACTOR, LOW, HIGH, ORIGINAL = 8.0, 1.0, 4.0, 8192


def rope_divisors(base: float, dim: int) -> list[float]:
    """Llama 3.1's divisor of each rotation pair's frequency base^(-2i/dim): 1 for wavelengths
    under ORIGINAL / HIGH, FACTOR over ORIGINAL / LOW, a smooth blend between."""
    out = []
    for i in range(dim // 2):
        wavelen = 2 * math.pi * base ** (2 * i / dim)
        if wavelen < ORIGINAL / HIGH:
            out.append(1.0)
        elif wavelen > ORIGINAL / LOW:
            out.append(FACTOR)
        else:
            smooth = (ORIGINAL / wavelen - LOW) / (HIGH - LOW)
            out.append(1.0 / ((1 - smooth) / FACTOR + smooth))
    return out


def main() -> None:
    spec = json.loads(gzip.decompress((SPECS / "llama8b.spec.json.gz").read_bytes()))
    fields = {f["name"]: f for f in spec["fields"]}
    fields["llama.context_length"]["value"] = CONTEXT
    fields["general.name"]["value"] = "Llama-3.1-8B shape twin"
    base = float(fields["llama.rope.freq_base"]["value"])
    dim = int(fields["llama.rope.dimension_count"]["value"])
    values = rope_divisors(base, dim)
    spec["tensors"].insert(1, {"name": "rope_freqs.weight", "type": "F32", "shape": [dim // 2],
                               "values": values})  # fmt: skip
    out = SPECS / "llama31_8b.spec.json.gz"
    out.write_bytes(gzip.compress(json.dumps(spec).encode(), mtime=0))
    print(f"{out}: context {CONTEXT}, rope_freqs {min(values):g}..{max(values):g}")


if __name__ == "__main__":
    main()
