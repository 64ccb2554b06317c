"""Build a shape twin with ../shared/tools/gguf_twin.py, optionally with fewer layers, and with
MXFP4 tensors that hold finite, realistic weights.

  python benchmarks/moe_twin.py SPEC.json.gz TWIN.gguf [--layers N] [--tool PATH/gguf_twin.py]

gguf_twin.py fills quant blocks with random bytes and sets their f16 scale fields to small values
(its F16_FIELDS); MXFP4 blocks have no f16 field but a one-byte E8M0 exponent, which random bytes
would make as large as 2^127 (inf in float32 products). Here each MXFP4 block's exponent is set
to 2^-9 .. 2^-6, the range of real weights. gguf_twin.py also hands quantized data to the GGUF
writer as 2-D bytes, which flattens a stacked expert tensor [K, N, n_expert] into [K, N *
n_expert]; here such data keeps its expert axis. `--layers N` keeps the first N layers (block_count
and the blk.* tensors), for a quick local check that forge and llama.cpp load the twin.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TOOL = ROOT.parent / "shared" / "tools" / "gguf_twin.py"
MXFP4_EXPONENTS = (118, 122)  # E8M0 bytes: scales 2^-9 .. 2^-6 (with the doubled E2M1 codes)


def load_tool(path: Path):
    spec = importlib.util.spec_from_file_location("gguf_twin", path)
    if spec is None or not path.exists():
        sys.exit(f"moe_twin: {path} not found (give --tool)")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.F16_FIELDS.setdefault("MXFP4", [])
    plain = tool.random_tensor

    def random_tensor(ttype, shape, rng):
        data = plain(ttype, shape, rng)
        if ttype == "MXFP4":
            blocks = data.reshape(data.shape[0], -1, 17)
            blocks[:, :, 0] = rng.integers(*MXFP4_EXPONENTS, size=blocks.shape[:2], dtype=np.uint8)
        if data.ndim == 2 and len(shape) > 2:  # quant bytes come back 2-D: keep the expert axis
            data = data.reshape(*reversed(shape[1:]), data.shape[1])
        return data

    tool.random_tensor = random_tensor
    return tool


def fewer_layers(spec: dict, n_layer: int) -> dict:
    """The spec with only its first `n_layer` layers."""
    key = f"{spec['arch']}.block_count"
    fields = [dict(f, value=n_layer) if f["name"] == key else f for f in spec["fields"]]

    def kept(name: str) -> bool:
        return not name.startswith("blk.") or int(name.split(".")[1]) < n_layer

    tensors = [t for t in spec["tensors"] if kept(t["name"])]
    return {**spec, "fields": fields, "tensors": tensors}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec")
    p.add_argument("out")
    p.add_argument("--layers", type=int, help="keep only the first N layers")
    p.add_argument("--tool", type=Path, default=DEFAULT_TOOL, help="gguf_twin.py")
    args = p.parse_args(argv)
    tool = load_tool(args.tool)
    opener = gzip.open if args.spec.endswith(".gz") else open
    with opener(args.spec, "rt") as f:
        spec = json.load(f)
    if args.layers:
        spec = fewer_layers(spec, args.layers)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.json"
        path.write_text(json.dumps(spec))
        tool.build(str(path), args.out)
    print(f"{args.out}: {len(spec['tensors'])} tensors")


if __name__ == "__main__":
    main()
