"""Shape-twin specs of the two mixture-of-experts models of issue 27, from their public configs:
the format of ../shared/tools/gguf_twin.py (`build SPEC TWIN` writes a random-weight twin).

  python benchmarks/moe_specs.py            # writes benchmarks/specs/{qwen3_30b_a3b_q4_k_m,
                                            # gpt_oss_20b_mxfp4}.spec.json.gz

- Qwen3-30B-A3B, Q4_K_M: 48 layers, hidden 2048, 32 query / 4 KV heads of 128, 128 experts of
  768 (8 used), vocab 151936, RoPE base 1e6. Weight types as llama.cpp's Q4_K_M rule gives them:
  Q4_K, with Q6_K for the output head and, in the layers its use_more_bits rule picks (the
  first and last eighth, and every third between), attn_v and ffn_down_exps.
- gpt-oss-20b, MXFP4 experts: 24 layers, hidden 2880, 64 query / 8 KV heads of 64, 32 experts
  of 2880 (4 used), vocab 201088, sliding window 128 on every other layer, RoPE base 150000,
  YaRN factor 32 over 4096 positions; the other matrices Q8_0 (llama.cpp's MXFP4_MOE mix).

The vocabularies are synthetic but complete for llama.cpp's loader: the 256 byte-level tokens
first (its BPE needs the newline token), unique filler tokens, the model's special tokens at
their real ids, a few merges, and the pre-tokenizer each architecture names ("qwen2",
"gpt-4o"). llama-bench feeds random token ids, so the text a token stands for does not matter.
"""

from __future__ import annotations

import gzip
import json
import string
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from forge.tokenizer.bpe import BYTE_TO_UNICODE  # noqa: E402

OUT = Path(__file__).resolve().parent / "specs"
NORMAL, CONTROL, UNUSED = 1, 3, 5


def field(name: str, value, kind: str = "UINT32", sub: str | None = None) -> dict:
    return {"name": name, "type": kind, "sub": sub, "value": value}


def vocabulary(n_vocab: int, specials: dict[int, str], n_real: int) -> tuple[list, list]:
    """(tokens, types): byte tokens, unique fillers up to `n_real`, `specials` at their ids,
    unused padding up to `n_vocab`."""
    letters = string.ascii_letters
    tokens, types = list(BYTE_TO_UNICODE), [NORMAL] * 256
    i = 0
    while len(tokens) < n_real:
        if len(tokens) in specials:
            tokens.append(specials[len(tokens)])
            types.append(CONTROL)
            continue
        word, k = "", i
        while True:  # a unique word of two or more letters, with GPT-2's space marker
            word = letters[k % 52] + word
            k //= 52
            if not k:
                break
        tokens.append("\u0120" + word + "x")
        types.append(NORMAL)
        i += 1
    for tid in range(n_real, n_vocab):
        tokens.append(specials.get(tid, f"[PAD{tid}]"))
        types.append(CONTROL if tid in specials else UNUSED)
    return tokens, types


def tokenizer_fields(pre: str, tokens: list, types: list, ids: dict[str, int]) -> list[dict]:
    merges = ["\u0120 t", "h e", "i n", "e r", "a n", "\u0120 a"]
    out = [
        field("tokenizer.ggml.model", "gpt2", "STRING"),
        field("tokenizer.ggml.pre", pre, "STRING"),
        field("tokenizer.ggml.tokens", tokens, "ARRAY", "STRING"),
        field("tokenizer.ggml.token_type", types, "ARRAY", "INT32"),
        field("tokenizer.ggml.merges", merges, "ARRAY", "STRING"),
        field("tokenizer.ggml.add_bos_token", False, "BOOL"),
    ]
    out += [field(f"tokenizer.ggml.{key}_token_id", tid) for key, tid in ids.items()]
    return out


def arch_fields(arch: str, name: str, **values) -> list[dict]:
    """general.architecture/name, then `<arch>.<key>` fields (keys with "__" for "."): floats
    as FLOAT32, strings as STRING, the rest UINT32."""
    out = [field("general.architecture", arch, "STRING"), field("general.name", name, "STRING")]
    for key, value in values.items():
        kind = {float: "FLOAT32", str: "STRING"}.get(type(value), "UINT32")
        out.append(field(f"{arch}.{key.replace('__', '.')}", value, kind))
    return out


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's Q4_K_M rule for the layers that keep more bits in attn_v and ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def qwen3_30b_a3b() -> dict:
    arch, n_layer, e, ff, n_exp, vocab = "qwen3moe", 48, 2048, 768, 128, 151936
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
             "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
             "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
             "<|image_pad|>", "<|video_pad|>"]  # fmt: skip
    specials = {151643 + i: t for i, t in enumerate(names)}
    tokens, types = vocabulary(vocab, specials, 151669)
    fields = [
        *arch_fields(
            arch,
            "Qwen3-30B-A3B shape twin",
            block_count=n_layer,
            context_length=40960,
            embedding_length=e,
            feed_forward_length=6144,
            attention__head_count=32,
            attention__head_count_kv=4,
            rope__freq_base=1e6,
            attention__layer_norm_rms_epsilon=1e-6,
            expert_used_count=8,
            attention__key_length=128,
            attention__value_length=128,
            expert_count=n_exp,
            expert_feed_forward_length=ff,
        ),  # fmt: skip
        field("general.file_type", 15),  # MOSTLY_Q4_K_M
        field("general.quantization_version", 2),
        *tokenizer_fields(
            "qwen2", tokens, types, {"bos": 151643, "eos": 151645, "padding": 151643}
        ),
    ]
    t = [("token_embd.weight", "Q4_K", [e, vocab]), ("output_norm.weight", "F32", [e]),
         ("output.weight", "Q6_K", [e, vocab])]  # fmt: skip
    for i in range(n_layer):
        more = "Q6_K" if use_more_bits(i, n_layer) else "Q4_K"
        p = f"blk.{i}."
        t += [
            (p + "attn_norm.weight", "F32", [e]),
            (p + "attn_q.weight", "Q4_K", [e, 32 * 128]),
            (p + "attn_k.weight", "Q4_K", [e, 4 * 128]),
            (p + "attn_v.weight", more, [e, 4 * 128]),
            (p + "attn_output.weight", "Q4_K", [32 * 128, e]),
            (p + "attn_q_norm.weight", "F32", [128]),
            (p + "attn_k_norm.weight", "F32", [128]),
            (p + "ffn_norm.weight", "F32", [e]),
            (p + "ffn_gate_inp.weight", "F32", [e, n_exp]),
            (p + "ffn_gate_exps.weight", "Q4_K", [e, ff, n_exp]),
            (p + "ffn_up_exps.weight", "Q4_K", [e, ff, n_exp]),
            (p + "ffn_down_exps.weight", more, [ff, e, n_exp]),
        ]
    return {"arch": arch, "fields": fields, "tensors": [_tensor(*x) for x in t]}


def gpt_oss_20b() -> dict:
    arch, n_layer, e, ff, n_exp, vocab = "gpt-oss", 24, 2880, 2880, 32, 201088
    q, kv = 64 * 64, 8 * 64
    specials = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>",
                200003: "<|constrain|>", 200005: "<|channel|>", 200006: "<|start|>",
                200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>"}  # fmt: skip
    specials.update({i: f"<|reserved_{i}|>" for i in range(199998, vocab) if i not in specials})
    tokens, types = vocabulary(vocab, specials, vocab)
    fields = [
        *arch_fields(
            arch,
            "gpt-oss-20b shape twin",
            block_count=n_layer,
            context_length=131072,
            embedding_length=e,
            feed_forward_length=ff,
            attention__head_count=64,
            attention__head_count_kv=8,
            rope__freq_base=150000.0,
            attention__layer_norm_rms_epsilon=1e-5,
            expert_count=n_exp,
            expert_used_count=4,
            attention__key_length=64,
            attention__value_length=64,
            attention__sliding_window=128,
            expert_feed_forward_length=ff,
            rope__dimension_count=64,
            rope__scaling__type="yarn",
            rope__scaling__factor=32.0,
            rope__scaling__original_context_length=4096,
        ),  # fmt: skip
        field("general.file_type", 38),  # MOSTLY_MXFP4_MOE
        field("general.quantization_version", 2),
        *tokenizer_fields(
            "gpt-4o", tokens, types, {"bos": 199998, "eos": 200002, "padding": 199999}
        ),  # fmt: skip
    ]
    t = [("token_embd.weight", "Q8_0", [e, vocab]), ("output_norm.weight", "F32", [e]),
         ("output.weight", "Q8_0", [e, vocab])]  # fmt: skip
    for i in range(n_layer):
        p = f"blk.{i}."
        t += [
            (p + "attn_norm.weight", "F32", [e]),
            (p + "attn_q.weight", "Q8_0", [e, q]),
            (p + "attn_q.bias", "F32", [q]),
            (p + "attn_k.weight", "Q8_0", [e, kv]),
            (p + "attn_k.bias", "F32", [kv]),
            (p + "attn_v.weight", "Q8_0", [e, kv]),
            (p + "attn_v.bias", "F32", [kv]),
            (p + "attn_output.weight", "Q8_0", [q, e]),
            (p + "attn_output.bias", "F32", [e]),
            (p + "attn_sinks.weight", "F32", [64]),
            (p + "post_attention_norm.weight", "F32", [e]),
            (p + "ffn_gate_inp.weight", "F32", [e, n_exp]),
            (p + "ffn_gate_inp.bias", "F32", [n_exp]),
            (p + "ffn_gate_exps.weight", "MXFP4", [e, ff, n_exp]),
            (p + "ffn_gate_exps.bias", "F32", [ff, n_exp]),
            (p + "ffn_up_exps.weight", "MXFP4", [e, ff, n_exp]),
            (p + "ffn_up_exps.bias", "F32", [ff, n_exp]),
            (p + "ffn_down_exps.weight", "MXFP4", [ff, e, n_exp]),
            (p + "ffn_down_exps.bias", "F32", [e, n_exp]),
        ]
    return {"arch": arch, "fields": fields, "tensors": [_tensor(*x) for x in t]}


def _tensor(name: str, kind: str, shape: list[int]) -> dict:
    return {"name": name, "type": kind, "shape": shape}


def main() -> None:
    for stem, spec in (("qwen3_30b_a3b_q4_k_m", qwen3_30b_a3b()), ("gpt_oss_20b_mxfp4",
                                                                   gpt_oss_20b())):  # fmt: skip
        path = OUT / f"{stem}.spec.json.gz"
        with gzip.GzipFile(path, "wb", mtime=0) as f:  # mtime 0: the same bytes every run
            f.write(json.dumps(spec).encode())
        print(f"{path}: {len(spec['tensors'])} tensors, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
