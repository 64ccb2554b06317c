"""Small mixture-of-experts GGUF files (qwen3moe and gpt-oss shapes) with random weights, for the
tests that need a complete model of either kind without the golden data: unit tests of the
experts block against float64 references, the harmony chat format through the server, and the
RoPE-scaling checks.

`moe_model(path, arch, qtype)` writes one; `HARMONY_TOKENS` are the special tokens of the
gpt-oss vocabulary (o200k's, as real gpt-oss files name them).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from gguf.quants import quantize

from tests.support.gguf_factory import KV, Tensor, write_gguf

HARMONY_TOKENS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                  "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>"]  # fmt: skip
# sizes: n_embd, heads, KV heads, head dim, experts, used, expert width, layers
E, H, HKV, D, N_EXPERT, N_USED, FF, LAYERS = 64, 4, 2, 16, 4, 2, 32, 2


def _vocab(arch: str) -> list[KV]:
    byte_chars = [chr(c) for c in range(33, 127)] + ["\u0120", "\u010a"]  # + space, newline
    words = ["\u0120a", "ab", "\u0120ab", "an", "al", "aly", "ys", "is", "fin", "in"]
    if arch == "gpt-oss":
        specials, pre = HARMONY_TOKENS, "gpt-4o"
    else:
        specials, pre = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "qwen2"
    pieces = byte_chars + words + specials
    types = [1] * (len(pieces) - len(specials)) + [3] * len(specials)
    eos = "<|return|>" if arch == "gpt-oss" else "<|im_end|>"
    return [
        ("tokenizer.ggml.model", "gpt2", V.STRING, None),
        ("tokenizer.ggml.pre", pre, V.STRING, None),
        ("tokenizer.ggml.tokens", pieces, V.ARRAY, V.STRING),
        ("tokenizer.ggml.token_type", types, V.ARRAY, V.INT32),
        (
            "tokenizer.ggml.merges",
            ["\u0120 a", "a b", "\u0120 ab", "a n", "a l", "y s"],
            V.ARRAY,
            V.STRING,
        ),  # fmt: skip
        ("tokenizer.ggml.eos_token_id", pieces.index(eos), V.UINT32, None),
        ("tokenizer.ggml.add_bos_token", False, V.BOOL, None),
    ]


def _hparams(arch: str) -> list[KV]:
    kvs: list[KV] = [
        ("general.name", f"tiny-{arch}", V.STRING, None),
        (f"{arch}.context_length", 512, V.UINT32, None),
        (f"{arch}.embedding_length", E, V.UINT32, None),
        (f"{arch}.block_count", LAYERS, V.UINT32, None),
        (f"{arch}.feed_forward_length", FF, V.UINT32, None),
        (f"{arch}.attention.head_count", H, V.UINT32, None),
        (f"{arch}.attention.head_count_kv", HKV, V.UINT32, None),
        (f"{arch}.attention.key_length", D, V.UINT32, None),
        (f"{arch}.attention.value_length", D, V.UINT32, None),
        (f"{arch}.attention.layer_norm_rms_epsilon", 1e-5, V.FLOAT32, None),
        (f"{arch}.rope.freq_base", 10000.0, V.FLOAT32, None),
        (f"{arch}.expert_count", N_EXPERT, V.UINT32, None),
        (f"{arch}.expert_used_count", N_USED, V.UINT32, None),
        (f"{arch}.expert_feed_forward_length", FF, V.UINT32, None),
    ]
    if arch == "gpt-oss":
        kvs += [
            ("gpt-oss.attention.sliding_window", 4, V.UINT32, None),
            ("gpt-oss.rope.scaling.type", "yarn", V.STRING, None),
            ("gpt-oss.rope.scaling.factor", 8.0, V.FLOAT32, None),
            ("gpt-oss.rope.scaling.original_context_length", 64, V.UINT32, None),
        ]
    return kvs


class _Weights:
    def __init__(self, qtype: Q, seed: int):
        self.qtype, self.rng = qtype, np.random.default_rng(seed)

    def matrix(self, *shape: int, scale: float = 0.3) -> tuple[np.ndarray, Q | None]:
        """Random weights of numpy shape `shape` (the GGML shape reversed), stored as qtype."""
        x = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return (x, None) if self.qtype == Q.F32 else (quantize(x, self.qtype), self.qtype)

    def vector(self, *shape: int, scale: float = 0.1, offset: float = 0.0) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale + offset).astype(np.float32)


def moe_model(path: Path, arch: str = "qwen3moe", qtype: Q = Q.F32, seed: int = 0) -> Path:
    """A complete `arch` ("qwen3moe" or "gpt-oss") model of LAYERS layers whose matrices are
    `qtype` (F32, Q8_0, MXFP4, ...; norms, biases, sinks and the router stay F32)."""
    vocab = _vocab(arch)
    n_vocab = len(vocab[2][1])
    w = _Weights(qtype, seed)
    tensors: list[Tensor] = [
        ("token_embd.weight", *w.matrix(n_vocab, E, scale=1.0)),
        ("output_norm.weight", w.vector(E, offset=1.0), None),
        ("output.weight", *w.matrix(n_vocab, E)),
    ]
    for i in range(LAYERS):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", w.vector(E, offset=1.0), None),
            (p + "attn_q.weight", *w.matrix(H * D, E)),
            (p + "attn_k.weight", *w.matrix(HKV * D, E)),
            (p + "attn_v.weight", *w.matrix(HKV * D, E)),
            (p + "attn_output.weight", *w.matrix(E, H * D)),
            (p + "ffn_gate_inp.weight", w.vector(N_EXPERT, E, scale=1.0), None),
            (p + "ffn_gate_exps.weight", *w.matrix(N_EXPERT, FF, E)),
            (p + "ffn_up_exps.weight", *w.matrix(N_EXPERT, FF, E)),
            (p + "ffn_down_exps.weight", *w.matrix(N_EXPERT, E, FF)),
        ]
        if arch == "gpt-oss":
            tensors += [
                (p + "post_attention_norm.weight", w.vector(E, offset=1.0), None),
                (p + "attn_q.bias", w.vector(H * D), None),
                (p + "attn_k.bias", w.vector(HKV * D), None),
                (p + "attn_v.bias", w.vector(HKV * D), None),
                (p + "attn_output.bias", w.vector(E), None),
                (p + "attn_sinks.weight", w.vector(H, scale=1.0), None),
                (p + "ffn_gate_inp.bias", w.vector(N_EXPERT), None),
                (p + "ffn_gate_exps.bias", w.vector(N_EXPERT, FF), None),
                (p + "ffn_up_exps.bias", w.vector(N_EXPERT, FF), None),
                (p + "ffn_down_exps.bias", w.vector(N_EXPERT, E), None),
            ]
        else:
            tensors += [
                (p + "ffn_norm.weight", w.vector(E, offset=1.0), None),
                (p + "attn_q_norm.weight", w.vector(D, offset=1.0), None),
                (p + "attn_k_norm.weight", w.vector(D, offset=1.0), None),
            ]
    return write_gguf(path, _hparams(arch) + vocab, tensors, arch=arch)
