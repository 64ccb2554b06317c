"""Shape twins of GGUF files: same metadata, tensor names, shapes and types; random weights.

Copied from the project's shared tool ../shared/tools/gguf_twin.py (our own, not third-party code)
so that it travels to the GPU machine with the repository; spec files may be gzip-compressed here.

A twin runs exactly like the original (same bytes to move, same kernels), so it serves for speed
and memory measurements where the original is too large to carry, e.g. to the lent GPU machine.
Its output text is meaningless. A spec's tensor may carry "values" (float32, written as given):
for tensors whose numbers are part of the model's shape, such as Llama 3.1's rope_freqs.

  python gguf_twin.py spec MODEL.gguf SPEC.json      # here: a few MB of metadata, no weights
  python gguf_twin.py build SPEC.json TWIN.gguf      # there: writes the twin (needs numpy and gguf)
"""

import gzip
import json
import sys

import gguf
import numpy as np

# Byte offsets of the f16 scale fields inside one block, per quant type; they are set to small
# finite values so that random bits decode to finite weights of a realistic size.
F16_FIELDS = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
}


def spec(src, out):
    r = gguf.GGUFReader(src)
    fields = []
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        fields.append(
            {"name": name, "type": vt.name, "sub": sub.name if sub else None, "value": f.contents()}
        )
    tensors = [
        {"name": t.name, "type": t.tensor_type.name, "shape": [int(x) for x in t.shape]}
        for t in r.tensors
    ]
    arch = r.fields["general.architecture"].contents()
    json.dump({"arch": arch, "fields": fields, "tensors": tensors}, open(out, "w"))


def random_tensor(ttype, shape, rng):
    qt = gguf.GGMLQuantizationType[ttype]
    n = int(np.prod(shape))
    if ttype in ("F32", "F16", "BF16"):
        x = (rng.standard_normal(n) * 0.02).astype(np.float32)
        if ttype == "F16":
            x = x.astype(np.float16)
        elif ttype == "BF16":
            x = (x.view(np.uint32) >> 16).astype(np.uint16)
        return x.reshape(list(reversed(shape)))
    block, nbytes = gguf.GGML_QUANT_SIZES[qt]
    rows = n // shape[0]
    nblocks = shape[0] // block
    raw = rng.integers(0, 256, size=(rows, nblocks, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[ttype]:
        d = (rng.uniform(0.5, 1.5, size=(rows, nblocks)) * 2e-3).astype(np.float16)
        raw[:, :, off : off + 2] = d.view(np.uint8).reshape(rows, nblocks, 2)
    return raw.reshape(rows, nblocks * nbytes)


def build(spec_path, out):
    opener = gzip.open if str(spec_path).endswith(".gz") else open
    with opener(spec_path, "rt") as f:
        s = json.load(f)
    w = gguf.GGUFWriter(out, s["arch"])
    for f in s["fields"]:
        if f["name"] == "general.architecture":
            continue
        vt = gguf.GGUFValueType[f["type"]]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(f["name"], f["value"], vt, sub_type=gguf.GGUFValueType[f["sub"]])
        else:
            w.add_key_value(f["name"], f["value"], vt)
    rng = np.random.default_rng(0)
    for t in s["tensors"]:
        if "values" in t:  # a tensor whose numbers matter (Llama 3.1's rope_freqs): as given
            data = np.asarray(t["values"], np.float32).reshape(list(reversed(t["shape"])))
        else:
            data = random_tensor(t["type"], t["shape"], rng)
        qt = gguf.GGMLQuantizationType[t["type"]]
        w.add_tensor(t["name"], data, raw_dtype=None if t["type"] in ("F32", "F16") else qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    {"spec": spec, "build": build}[sys.argv[1]](sys.argv[2], sys.argv[3])
