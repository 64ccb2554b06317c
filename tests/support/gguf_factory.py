"""Test helpers that write small GGUF files with the `gguf` package's GGUFWriter.

`write_gguf` writes arbitrary metadata and tensors; `tiny_model` writes a complete, model-like
file (Llama with a SentencePiece vocabulary, or Qwen2 with a BPE one) that the whole load path
accepts; `rewrite_gguf` copies an existing file with one change (a key dropped or retyped, a
tensor dropped or reshaped) for the model-validation tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

# (key, value, value type, element type of an array or None)
KV = tuple[str, Any, V, V | None]
# (name, data, raw type or None); quantized data is uint8 [rows, row_bytes]
Tensor = tuple[str, np.ndarray, Q | None]


def write_gguf(
    path: Path, kvs: Iterable[KV], tensors: Iterable[Tensor] = (), arch: str = "test"
) -> Path:
    """Write a GGUF v3 file with `general.architecture = arch` first, then `kvs` and `tensors`."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value, vtype, sub in kvs:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, data, raw in tensors:
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def quantized(rows: int, cols: int, qtype: Q, seed: int = 0) -> np.ndarray:
    """Random valid-looking bytes of a [rows, cols] tensor of quant type `qtype` (uint8)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)
    if qtype == Q.Q8_0:  # keep the f16 scale of each block finite and small
        data.reshape(rows, -1, size)[:, :, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return data


def _spm_vocab() -> list[KV]:
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["\u2581", "\u2581a", "\u2581b", "ab", "a", "b", "\u2581ab", "c"]
    types = [2, 3, 3] + [6] * 256 + [1] * 8
    scores = [0.0] * 259 + [-float(i) for i in range(8)]
    return [
        ("tokenizer.ggml.model", "llama", V.STRING, None),
        ("tokenizer.ggml.tokens", pieces, V.ARRAY, V.STRING),
        ("tokenizer.ggml.scores", scores, V.ARRAY, V.FLOAT32),
        ("tokenizer.ggml.token_type", types, V.ARRAY, V.INT32),
        ("tokenizer.ggml.bos_token_id", 1, V.UINT32, None),
        ("tokenizer.ggml.eos_token_id", 2, V.UINT32, None),
        ("tokenizer.ggml.add_bos_token", True, V.BOOL, None),
    ]


def _bpe_vocab() -> list[KV]:
    byte_chars = [chr(c) for c in range(33, 127)]  # printable ASCII bytes map to themselves
    pieces = byte_chars + ["\u0120", "\u0120a", "ab", "\u0120ab", "<|endoftext|>"]
    types = [1] * (len(pieces) - 1) + [3]
    merges = ["\u0120 a", "a b", "\u0120 ab"]
    return [
        ("tokenizer.ggml.model", "gpt2", V.STRING, None),
        ("tokenizer.ggml.pre", "qwen2", V.STRING, None),
        ("tokenizer.ggml.tokens", pieces, V.ARRAY, V.STRING),
        ("tokenizer.ggml.token_type", types, V.ARRAY, V.INT32),
        ("tokenizer.ggml.merges", merges, V.ARRAY, V.STRING),
        ("tokenizer.ggml.eos_token_id", len(pieces) - 1, V.UINT32, None),
        ("tokenizer.ggml.add_bos_token", False, V.BOOL, None),
    ]


def tiny_model(path: Path, arch: str = "llama") -> Path:
    """A complete one-layer model (arch "llama": SPM vocab; "qwen2": BPE vocab and QKV biases)
    with n_embd 32, 2 query heads and 1 KV head of 16, n_ff 64; matrices in Q8_0."""
    vocab = _spm_vocab() if arch == "llama" else _bpe_vocab()
    n_vocab = len(next(v for k, v, _, _ in vocab if k == "tokenizer.ggml.tokens"))
    e, hd, ff = 32, 16, 64
    kvs: list[KV] = [
        ("general.name", f"tiny-{arch}", V.STRING, None),
        (f"{arch}.context_length", 64, V.UINT32, None),
        (f"{arch}.embedding_length", e, V.UINT32, None),
        (f"{arch}.block_count", 1, V.UINT32, None),
        (f"{arch}.feed_forward_length", ff, V.UINT32, None),
        (f"{arch}.attention.head_count", 2, V.UINT32, None),
        (f"{arch}.attention.head_count_kv", 1, V.UINT32, None),
        (f"{arch}.attention.layer_norm_rms_epsilon", 1e-6, V.FLOAT32, None),
        (f"{arch}.rope.freq_base", 10000.0, V.FLOAT32, None),
        *vocab,
    ]
    ones = np.ones(e, np.float32)
    tensors: list[Tensor] = [
        ("token_embd.weight", quantized(n_vocab, e, Q.Q8_0, 1), Q.Q8_0),
        ("output_norm.weight", ones, None),
        ("output.weight", quantized(n_vocab, e, Q.Q8_0, 2), Q.Q8_0),
        ("blk.0.attn_norm.weight", ones, None),
        ("blk.0.attn_q.weight", quantized(2 * hd, e, Q.Q8_0, 3), Q.Q8_0),
        ("blk.0.attn_k.weight", quantized(hd, e, Q.Q8_0, 4), Q.Q8_0),
        ("blk.0.attn_v.weight", quantized(hd, e, Q.Q8_0, 5), Q.Q8_0),
        ("blk.0.attn_output.weight", quantized(e, 2 * hd, Q.Q8_0, 6), Q.Q8_0),
        ("blk.0.ffn_norm.weight", ones, None),
        ("blk.0.ffn_gate.weight", quantized(ff, e, Q.Q8_0, 7), Q.Q8_0),
        ("blk.0.ffn_up.weight", quantized(ff, e, Q.Q8_0, 8), Q.Q8_0),
        ("blk.0.ffn_down.weight", quantized(e, ff, Q.Q8_0, 9), Q.Q8_0),
    ]
    if arch == "qwen2":
        tensors += [
            ("blk.0.attn_q.bias", np.zeros(2 * hd, np.float32), None),
            ("blk.0.attn_k.bias", np.zeros(hd, np.float32), None),
            ("blk.0.attn_v.bias", np.zeros(hd, np.float32), None),
        ]
    return write_gguf(path, kvs, tensors, arch=arch)


def read_source(src: Path) -> tuple[str, list[KV], list[Tensor]]:
    """(architecture, metadata, tensors) of an existing file, in `write_gguf`'s terms."""
    r = gguf.GGUFReader(str(src))
    arch, kvs = "", []
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        if key == "general.architecture":
            arch = field.contents()
            continue
        sub = field.types[-1] if field.types[0] == V.ARRAY else None
        kvs.append((key, field.contents(), field.types[0], sub))
    tensors = []
    for t in r.tensors:
        qtype = Q(t.tensor_type)
        raw = None if qtype in (Q.F32, Q.F16) else qtype
        data = np.array(t.data)
        if raw is not None and data.dtype != np.uint8:
            data = data.view(np.uint8)
        tensors.append((t.name, data, raw))
    return arch, kvs, tensors


def rewrite_gguf(
    src: Path | tuple[str, list[KV], list[Tensor]],
    dst: Path,
    *,
    arch: str | None = None,
    drop_keys: Iterable[str] = (),
    set_kv: Iterable[KV] = (),
    drop_tensors: Iterable[str] = (),
    edit_tensors: Callable[[list[Tensor]], list[Tensor]] | None = None,
) -> Path:
    """Copy `src` (a file, or what `read_source` read from one) to `dst` with the given changes
    (everything else byte-for-byte equal)."""
    src_arch, kvs, tensors = src if isinstance(src, tuple) else read_source(src)
    new_arch = arch or src_arch
    drop = set(drop_keys)
    overrides = {k: (k, v, t, s) for k, v, t, s in set_kv}
    out: list[KV] = []
    for key, value, vtype, sub in kvs:
        if src_arch != new_arch and key.startswith(f"{src_arch}."):
            key = f"{new_arch}." + key[len(src_arch) + 1 :]
        if key in drop:
            continue
        out.append(overrides.pop(key, (key, value, vtype, sub)))
    out += overrides.values()
    dropped = set(drop_tensors)
    tensors = [t for t in tensors if t[0] not in dropped]
    if edit_tensors is not None:
        tensors = edit_tensors(tensors)
    return write_gguf(dst, out, tensors, arch=new_arch)
