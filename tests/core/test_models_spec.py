"""forge.models.build_spec: specs of the golden models, and typed errors naming the key or tensor
when a golden model is rewritten with one thing wrong."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGUFValueType as V

from forge.errors import GGUFFormatError, ModelError, UnsupportedModelError
from forge.gguf import open_gguf
from forge.models import Attention, DenseFFN, build_spec, expected_shapes
from tests.support.gguf_factory import rewrite_gguf
from tests.support.golden_rules import golden_model_files

SRC = "llama-q8_0.gguf"


@pytest.fixture
def rewrite(golden_dir, tmp_path):
    """rewrite(**changes) -> GGUFFile of the golden Llama Q8_0 model with `changes` applied."""

    def make(**changes):
        path = rewrite_gguf(golden_dir / "models" / SRC, tmp_path / "m.gguf", **changes)
        return open_gguf(path)

    return make


def test_rewrite_without_changes_is_byte_identical(golden_dir, tmp_path):
    src = golden_dir / "models" / SRC
    out = rewrite_gguf(src, tmp_path / "same.gguf")
    assert out.read_bytes() == src.read_bytes()


def test_llama_spec_matches_its_metadata(golden_dir):
    g = open_gguf(golden_dir / "models" / SRC)
    spec = build_spec(g)
    md = g.metadata
    assert spec.arch == "llama" and spec.name == md["general.name"]
    assert spec.n_vocab == len(md["tokenizer.ggml.tokens"]) == 535
    assert (spec.n_embd, spec.n_layer, spec.ffn.n_ff) == (256, 2, 512)
    assert (spec.n_head, spec.n_head_kv, spec.head_dim, spec.head_dim_v) == (4, 2, 64, 64)
    assert spec.rms_eps == pytest.approx(1e-6)
    assert spec.attn_scale == pytest.approx(1 / math.sqrt(64))
    assert not spec.tied_output and not spec.rope_neox
    assert spec.attention == Attention() and spec.ffn == DenseFFN(n_ff=512, activation="silu")
    assert sorted(spec.weight_names()) == sorted(g.tensors)


@pytest.mark.parametrize(
    "model, flags, attention, ffn",
    [
        ("qwen2-q4_k.gguf", {"rope_neox": True, "tied_output": False},
         Attention(qkv_bias=True), DenseFFN(n_ff=512)),
        ("qwen3-q8_0.gguf", {"rope_neox": True, "tied_output": True},
         Attention(qk_norm=True), DenseFFN(n_ff=512)),
        ("gemma3-f16.gguf", {"tied_output": True, "embed_scale": 16.0},
         Attention(qk_norm=True, post_norm=True),
         DenseFFN(n_ff=512, activation="gelu_tanh", post_norm=True)),
    ],
)  # fmt: skip
def test_architecture_parts(golden_dir, model, flags, attention, ffn):
    g = open_gguf(golden_dir / "models" / model)
    spec = build_spec(g)
    for key, value in flags.items():
        assert getattr(spec, key) == value, key
    assert (spec.attention, spec.ffn) == (attention, ffn)
    assert set(spec.weight_names()) == set(g.tensors)
    if spec.arch == "gemma3":
        windows = [layer.sliding_window for layer in spec.layers]
        assert windows == [8, 8, 8, 8, 8, None]
        assert spec.layers[0].rope_base == 10000.0 and spec.layers[5].rope_base == 1e6


def test_every_golden_model_builds(golden_dir):
    names = golden_model_files() + golden_model_files("moe.json")
    assert any(n.startswith("gpt-oss") for n in names) and any("moe" in n for n in names)
    for name in names:
        path = golden_dir / "models" / name
        g = open_gguf(path)
        spec = build_spec(g)
        for name, shape in expected_shapes(spec).items():
            assert g.tensors[name].shape == shape, (path.name, name)


def test_unknown_architecture(rewrite):
    g = rewrite(arch="mamba")
    with pytest.raises(UnsupportedModelError, match=r"unknown architecture 'mamba' \(supported: "):
        build_spec(g)


def test_missing_architecture_key(golden_dir, tmp_path):
    data = (golden_dir / "models" / SRC).read_bytes()
    path = tmp_path / "noarch.gguf"
    path.write_bytes(data.replace(b"general.architecture", b"general.arch1tecture", 1))
    with pytest.raises(GGUFFormatError, match=r"no general.architecture"):
        build_spec(open_gguf(path))


@pytest.mark.parametrize("name", ["blk.1.ffn_down.weight", "output_norm.weight"])
def test_missing_tensor(rewrite, name):
    with pytest.raises(ModelError, match=rf"tensor '{name}' is missing"):
        build_spec(rewrite(drop_tensors=[name]))


def test_tensor_shape_disagrees_with_metadata(rewrite):
    def swap(tensors):
        # attn_k of 128 outputs where head_count_kv 2 x key_length 64 = 128 -> make it 64 outputs
        return [
            (n, d[: d.shape[0] // 2] if n == "blk.0.attn_k.weight" else d, q) for n, d, q in tensors
        ]

    with pytest.raises(
        ModelError,
        match=r"tensor 'blk.0.attn_k.weight' has shape \[256, 64\], but the metadata implies "
        r"\[256, 128\]",
    ):
        build_spec(rewrite(edit_tensors=swap))


def test_metadata_disagrees_with_shapes(rewrite):
    g = rewrite(set_kv=[("llama.feed_forward_length", 1024, V.UINT32, None)])
    with pytest.raises(
        ModelError, match=r"'blk.0.ffn_gate.weight' has shape \[256, 512\].*\[256, 1024\]"
    ):
        build_spec(g)


def test_tied_output_needs_vocab_sized_embedding(rewrite):
    # dropping output.weight makes the model tied: still valid, and the spec says so
    spec = build_spec(rewrite(drop_tensors=["output.weight"]))
    assert spec.tied_output and "output.weight" not in spec.weight_names()


@pytest.mark.parametrize(
    "key", ["llama.block_count", "llama.embedding_length", "llama.attention.head_count",
            "llama.feed_forward_length", "llama.context_length",
            "llama.attention.layer_norm_rms_epsilon"],
)  # fmt: skip
def test_missing_required_key(rewrite, key):
    with pytest.raises(ModelError, match=rf"metadata key '{key}' is missing"):
        build_spec(rewrite(drop_keys=[key]))


def test_missing_vocabulary_falls_back_to_vocab_size(rewrite):
    with pytest.raises(ModelError, match=r"metadata key 'llama.vocab_size' is missing"):
        build_spec(rewrite(drop_keys=["tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                                      "tokenizer.ggml.token_type"]))  # fmt: skip
    g = rewrite(
        drop_keys=["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"],
        set_kv=[("llama.vocab_size", 535, V.UINT32, None)],
    )
    assert build_spec(g).n_vocab == 535


@pytest.mark.parametrize(
    "key, value, vtype, sub, expected",
    [
        ("llama.embedding_length", "256", V.STRING, None, "should be int, got str"),
        ("llama.block_count", 2.0, V.FLOAT32, None, "should be int, got float"),
        ("llama.block_count", True, V.BOOL, None, "should be int, got bool"),
        ("llama.attention.head_count", [4, 4], V.ARRAY, V.UINT32, "should be int, got ndarray"),
        ("llama.attention.layer_norm_rms_epsilon", "1e-6", V.STRING, None,
         "should be float, got str"),
        ("llama.rope.freq_base", [1.0], V.ARRAY, V.FLOAT32, "should be float, got ndarray"),
    ],
)  # fmt: skip
def test_wrong_metadata_type(rewrite, key, value, vtype, sub, expected):
    with pytest.raises(ModelError, match=rf"metadata key '{key}' {expected}"):
        build_spec(rewrite(set_kv=[(key, value, vtype, sub)]))


def test_integer_accepted_where_a_float_is_expected(rewrite):
    spec = build_spec(rewrite(set_kv=[("llama.rope.freq_base", 500000, V.UINT32, None)]))
    assert spec.layers[0].rope_base == 500000.0


@pytest.mark.parametrize(
    "key, value, vtype, expected",
    [
        ("llama.attention.head_count", 0, V.UINT32, r"'llama.attention.head_count' must be >= 1"),
        ("llama.embedding_length", 0, V.UINT32, r"'llama.embedding_length' must be >= 1"),
        ("llama.block_count", 0, V.UINT32, r"'llama.block_count' must be >= 1"),
        ("llama.block_count", 2**40, V.UINT64,
         r"'llama.block_count' = 1099511627776 .*only 21 tensors"),
        ("llama.attention.head_count_kv", -2, V.INT32,
         r"'llama.attention.head_count_kv' must be >= 1, got -2"),
        ("llama.attention.layer_norm_rms_epsilon", 0.0, V.FLOAT32,
         r"invalid hyper-parameters: rms_eps: Input should be greater than 0 \(got 0.0\)$"),
        ("llama.attention.layer_norm_rms_epsilon", float("nan"), V.FLOAT32,
         r"invalid hyper-parameters: rms_eps: .*\(got nan\)$"),
        ("llama.attention.key_length", 0, V.UINT32, r"'llama.attention.key_length' must be >= 1"),
    ],
)  # fmt: skip
def test_out_of_range_values(rewrite, key, value, vtype, expected):
    with pytest.raises(ModelError, match=expected):
        build_spec(rewrite(set_kv=[(key, value, vtype, None)]))


def test_unsupported_rope_scaling(rewrite):
    g = rewrite(
        set_kv=[
            ("llama.rope.scaling.type", "longrope", V.STRING, None),
            ("llama.rope.scaling.factor", 4.0, V.FLOAT32, None),
        ]
    )
    with pytest.raises(UnsupportedModelError, match=r"RoPE scaling 'longrope' is not supported"):
        build_spec(g)


def test_linear_rope_scaling(rewrite):
    g = rewrite(
        set_kv=[
            ("llama.rope.scaling.type", "linear", V.STRING, None),
            ("llama.rope.scaling.factor", 4.0, V.FLOAT32, None),
        ]
    )
    assert {layer.rope_scale for layer in build_spec(g).layers} == {4.0}


def test_qkv_bias_missing_for_qwen2(golden_dir, tmp_path):
    path = rewrite_gguf(
        golden_dir / "models" / "qwen2-q4_k.gguf",
        tmp_path / "q.gguf",
        drop_tensors=["blk.0.attn_v.bias"],
    )
    with pytest.raises(ModelError, match=r"tensor 'blk.0.attn_v.bias' is missing"):
        build_spec(open_gguf(path))


def test_qwen2_bias_data_is_preserved_by_rewrite(golden_dir, tmp_path):
    src = golden_dir / "models" / "qwen2-q4_k.gguf"
    out = open_gguf(rewrite_gguf(src, tmp_path / "q.gguf"))
    ref = open_gguf(src)
    np.testing.assert_array_equal(out.raw("blk.0.attn_q.bias"), ref.raw("blk.0.attn_q.bias"))
