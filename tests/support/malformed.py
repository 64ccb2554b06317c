"""A corpus of ~225 malformed model files, written on demand (nothing stored): hostile values of
every hyper-parameter key, missing and misshapen tensors, broken vocabularies, damaged headers,
and paths that are not regular files. `write_corpus(folder)` returns (label, path) pairs."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from gguf import GGUFValueType as V

from tests.support.gguf_factory import read_source, rewrite_gguf, tiny_model

KEYS = ["context_length", "embedding_length", "block_count", "feed_forward_length",
        "attention.head_count", "attention.head_count_kv", "attention.key_length",
        "attention.value_length", "rope.dimension_count", "vocab_size", "expert_count",
        "expert_used_count"]  # fmt: skip
# (value, GGUF type): zero, legal-looking small values, odd sizes and the integer extremes
VALUES = [(0, V.UINT32), (1, V.UINT32), (3, V.UINT32), (17, V.UINT32), (33, V.UINT32),
          (2**32 - 1, V.UINT32), (2**40, V.UINT64), (2**63, V.UINT64), (-1, V.INT32)]  # fmt: skip
FEW_VALUES = [(0, V.UINT32), (17, V.UINT32), (2**32 - 1, V.UINT32), (2**63, V.UINT64),
              (-1, V.INT32)]  # fmt: skip
GEMMA_EDITS = [("attention.sliding_window", v) for v in FEW_VALUES] + [
    ("rope.dimension_count", (127, V.UINT32)), ("rope.dimension_count", (256, V.UINT32)),
    ("rope.dimension_count", (2**32 - 1, V.UINT32)), ("attention.key_length", (64, V.UINT32)),
    ("attention.key_length", (2**31, V.UINT32)), ("attention.value_length", (0, V.UINT32)),
]  # fmt: skip


def write_corpus(folder: Path, golden_dir: Path | None = None) -> list[tuple[str, Path]]:
    folder.mkdir(parents=True, exist_ok=True)
    llama = tiny_model(folder / "base-llama.gguf", "llama")
    qwen2 = tiny_model(folder / "base-qwen2.gguf", "qwen2")
    cases: list[tuple[str, Path]] = []
    n = 0

    sources: dict[Path, tuple] = {}

    def add(label: str, changes: dict, src: Path) -> None:
        nonlocal n
        n += 1
        if src not in sources:
            sources[src] = read_source(src)
        cases.append((label, rewrite_gguf(sources[src], folder / f"case{n:03d}.gguf", **changes)))

    for src, arch, values in ((llama, "llama", VALUES), (qwen2, "qwen2", FEW_VALUES)):
        for key in KEYS:
            for value, vtype in values:
                add(f"{arch}.{key} = {value}", {"set_kv": [(f"{arch}.{key}", value, vtype, None)]},
                    src)  # fmt: skip
    if golden_dir is not None:
        gemma = golden_dir / "models" / "gemma3-q4_k_m.gguf"
        for key, (value, vtype) in GEMMA_EDITS:
            add(f"gemma3.{key} = {value}", {"set_kv": [(f"gemma3.{key}", value, vtype, None)]},
                gemma)  # fmt: skip
    for label, changes in _tensor_edits(llama):
        add(label, changes, llama)
    for label, changes in _vocab_edits(llama):
        add(label, changes, llama)
    for label, data in _damaged_headers(llama.read_bytes()):
        n += 1
        path = folder / f"case{n:03d}.gguf"
        path.write_bytes(data)
        cases.append((label, path))
    cases += _not_regular_files(folder)
    return cases


def _tensor_edits(src: Path) -> Iterator[tuple[str, dict]]:
    _, _, tensors = read_source(src)
    for name, _, _ in tensors:
        yield f"without tensor {name}", {"drop_tensors": [name]}
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_up.weight",
                 "token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight"):  # fmt: skip

        def reshape(ts, name=name):
            out = []
            for t_name, data, raw in ts:
                if t_name == name:  # one row fewer (or a 16-element norm)
                    data = data[:-1] if data.ndim == 2 else np.ones(16, np.float32)
                out.append((t_name, data, raw))
            return out

        yield f"tensor {name} misshapen", {"edit_tensors": reshape}


def _vocab_edits(src: Path) -> Iterator[tuple[str, dict]]:
    _, kvs, _ = read_source(src)
    md = {k: v for k, v, _, _ in kvs}
    tokens, types = list(md["tokenizer.ggml.tokens"]), list(md["tokenizer.ggml.token_type"])
    edits = [
        ("a one-token vocabulary", [("tokenizer.ggml.tokens", ["a"], V.ARRAY, V.STRING)]),
        ("a vocabulary one token longer", [("tokenizer.ggml.tokens", tokens + ["z"], V.ARRAY,
                                            V.STRING)]),
        ("token types shorter than the vocabulary", [("tokenizer.ggml.token_type", types[:-5],
                                                      V.ARRAY, V.INT32)]),
        ("bos id beyond the vocabulary", [("tokenizer.ggml.bos_token_id", 2**32 - 1, V.UINT32,
                                           None)]),
        ("eos id -1", [("tokenizer.ggml.eos_token_id", -1, V.INT32, None)]),
        ("scores of the wrong length", [("tokenizer.ggml.scores", [0.0], V.ARRAY, V.FLOAT32)]),
    ]  # fmt: skip
    for label, set_kv in edits:
        yield label, {"set_kv": set_kv}


def _damaged_headers(data: bytes) -> Iterator[tuple[str, bytes]]:
    for cut in (0, 3, 4, 8, 16, 23, 24, 100, len(data) // 2, len(data) - 1):
        yield f"truncated at {cut}", data[:cut]
    for offset, width, value in ((8, 8, 2**63), (16, 8, 2**40), (4, 4, 2**31), (16, 8, 0)):
        buf = bytearray(data)
        buf[offset : offset + width] = value.to_bytes(width, "little")
        yield f"header field at {offset} = {value}", bytes(buf)


def _not_regular_files(folder: Path) -> list[tuple[str, Path]]:
    fifo = folder / "fifo.gguf"
    os.mkfifo(fifo)
    (folder / "directory.gguf").mkdir()
    (folder / "empty.gguf").write_bytes(b"")
    for name, target in (("to-fifo.gguf", fifo), ("to-zero.gguf", Path("/dev/zero"))):
        os.symlink(target, folder / name)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "socket.gguf"))
    sock.close()
    names = ["fifo", "directory", "empty", "to-fifo", "to-zero", "socket"]
    return [(f"not a regular file: {name}", folder / f"{name}.gguf") for name in names]
