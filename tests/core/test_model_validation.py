"""Hyper-parameters that size an allocation or a loop are checked at load (forge.models.validate):
a hostile value is a ModelError naming the key, never a model that loads and then grows without
end or fails inside a kernel. Also: a FIFO (or anything but a regular file) is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from gguf import GGUFValueType as V

from forge.errors import GGUFFormatError, ModelError
from forge.gguf import open_gguf
from forge.models import build_spec
from tests.support.gguf_factory import rewrite_gguf, tiny_model


def _rewritten(tmp_path, src, **changes):
    return open_gguf(rewrite_gguf(src, tmp_path / "bad.gguf", **changes))


def _u32(key, value):
    return (key, value, V.UINT32, None)


@pytest.fixture
def qwen2(tmp_path):
    """The tiny qwen2 model (head size 16, 2 query heads, 1 KV head)."""
    return tiny_model(tmp_path / "qwen2.gguf", "qwen2")


@pytest.mark.parametrize("value", [0xFFFFFFFF, 17, 32, 15])
def test_rope_dimension_beyond_the_head_or_odd_is_refused(tmp_path, qwen2, value):
    g = _rewritten(tmp_path, qwen2, set_kv=[_u32("qwen2.rope.dimension_count", value)])
    with pytest.raises(ModelError, match=r"'qwen2\.rope\.dimension_count'") as e:
        build_spec(g)
    assert str(value) in str(e.value) and "16" in str(e.value)


def test_a_partial_rope_dimension_still_loads_and_runs(tmp_path, qwen2):
    """The check must not refuse what is legal: RoPE over the first 8 of 16 dims."""
    from forge.api import load

    path = rewrite_gguf(qwen2, tmp_path / "ok.gguf",
                        set_kv=[_u32("qwen2.rope.dimension_count", 8)])  # fmt: skip
    model = load(str(path), backend="cpu_simd", n_ctx=32)
    assert model.spec.rope_dim == 8
    assert len(model.complete("ab", max_tokens=2, temperature=0).tokens) >= 1


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"set_kv": [_u32("qwen2.attention.head_count_kv", 3)]}, "attention.head_count_kv"),
        ({"set_kv": [_u32("qwen2.attention.head_count_kv", 4)]}, "attention.head_count_kv"),
        ({"set_kv": [_u32("qwen2.attention.head_count", 4096),
                     _u32("qwen2.attention.key_length", 16)]}, "attention.head_count"),
        ({"set_kv": [_u32("qwen2.attention.head_count", 4096)]}, "attention.key_length"),
        ({"set_kv": [_u32("qwen2.attention.key_length", 1 << 20)]}, "attention.key_length"),
        ({"set_kv": [_u32("qwen2.attention.value_length", 1 << 20)]},
         "attention.value_length"),
        ({"set_kv": [("qwen2.context_length", 1 << 40, V.UINT64, None)]}, "context_length"),
        ({"set_kv": [_u32("qwen2.embedding_length", 1 << 30)]}, "embedding_length"),
        ({"set_kv": [_u32("qwen2.feed_forward_length", 1 << 30)]}, "feed_forward_length"),
        ({"set_kv": [_u32("qwen2.expert_count", 0)]}, "expert_count"),
        ({"set_kv": [_u32("qwen2.expert_count", 1 << 20)]}, "expert_count"),
        ({"set_kv": [_u32("qwen2.expert_count", 8), _u32("qwen2.expert_used_count", 9)]},
         "expert_used_count"),
        ({"set_kv": [_u32("qwen2.expert_count", 8), _u32("qwen2.expert_used_count", 0)]},
         "expert_used_count"),
        ({"set_kv": [_u32("qwen2.expert_used_count", 2)]}, "expert_used_count"),
        ({"set_kv": [("qwen2.expert_count", "8", V.STRING, None)]}, "expert_count"),
    ],
)  # fmt: skip
def test_hostile_sizes_name_their_key(tmp_path, qwen2, changes, key):
    g = _rewritten(tmp_path, qwen2, **changes)
    with pytest.raises(ModelError, match=rf"'qwen2\.{key}'"):
        build_spec(g)


def test_vocabulary_larger_than_the_embedding_names_the_key(tmp_path, qwen2):
    g = open_gguf(qwen2)
    tokens = list(g.metadata["tokenizer.ggml.tokens"]) + ["extra"]
    types = list(g.metadata["tokenizer.ggml.token_type"]) + [1]
    bad = _rewritten(tmp_path, qwen2, set_kv=[
        ("tokenizer.ggml.tokens", tokens, V.ARRAY, V.STRING),
        ("tokenizer.ggml.token_type", types, V.ARRAY, V.INT32)])  # fmt: skip
    with pytest.raises(ModelError, match=r"'tokenizer\.ggml\.tokens'.*token_embd\.weight"):
        build_spec(bad)


@pytest.mark.parametrize("window", [0, 1 << 40])
def test_sliding_window_out_of_range_names_the_key(golden_dir, tmp_path, window):
    src = golden_dir / "models" / "gemma3-q4_k_m.gguf"
    vtype = V.UINT64 if window > 0xFFFFFFFF else V.UINT32
    g = _rewritten(tmp_path, src, set_kv=[("gemma3.attention.sliding_window", window, vtype, None)])
    with pytest.raises(ModelError, match=r"'gemma3\.attention\.sliding_window'"):
        build_spec(g)


def test_golden_models_pass_validation(golden_dir):
    for name in ("llama-q8_0", "qwen2-q4_k", "qwen3-q8_0", "gemma3-q4_k_m"):
        spec = build_spec(open_gguf(golden_dir / "models" / f"{name}.gguf"))
        assert spec.rope_dim <= spec.head_dim


def test_expert_keys_in_range_are_accepted(tmp_path, qwen2):
    """Validated when present, never required: 8 experts, 2 used, is a fine file."""
    g = _rewritten(tmp_path, qwen2, set_kv=[_u32("qwen2.expert_count", 8),
                                            _u32("qwen2.expert_used_count", 2)])  # fmt: skip
    assert build_spec(g).arch == "qwen2"


def test_expert_count_disagreeing_with_the_router_tensor(tmp_path, qwen2):
    def add_router(tensors):
        return tensors + [("blk.0.ffn_gate_inp.weight", np.zeros((4, 32), np.float32), None)]

    g = _rewritten(tmp_path, qwen2, set_kv=[_u32("qwen2.expert_count", 8)],
                   edit_tensors=add_router)  # fmt: skip
    with pytest.raises(ModelError, match=r"'qwen2\.expert_count'.*ffn_gate_inp"):
        build_spec(g)


# -- files that are not regular files ------------------------------------------------------------
@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "model.gguf"
    os.mkfifo(path)
    return path


def test_a_fifo_is_refused_without_blocking(fifo):
    # a writer opened after 10 s unblocks a reader that waits on the FIFO: the test then fails
    # instead of hanging
    unblock = threading.Timer(10, lambda: os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)))
    unblock.daemon = True
    unblock.start()
    try:
        with pytest.raises(GGUFFormatError, match="not a regular file"):
            open_gguf(fifo)
    finally:
        unblock.cancel()


def test_a_character_device_is_refused():
    with pytest.raises(GGUFFormatError, match="not a regular file"):
        open_gguf("/dev/zero")


@pytest.mark.parametrize("command", ["inspect", "run"])
def test_cli_refuses_a_fifo(fifo, command):
    args = [sys.executable, "-m", "forge", command, str(fifo)]
    if command == "run":
        args += ["-p", "x", "--max-tokens", "1", "--backend", "cpu_simd"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "not a regular file" in r.stderr and "Traceback" not in r.stderr


# -- mixtures of experts (the golden qwen3moe and gpt-oss files, rewritten) ---------------------


@pytest.mark.parametrize(
    "model, key, value, match",
    [
        ("qwen3moe-q8_0", "expert_count", 0, r"'qwen3moe\.expert_count' must be >= 1, got 0"),
        ("qwen3moe-q8_0", "expert_used_count", 0,
         r"'qwen3moe\.expert_used_count' must be >= 1, got 0"),
        ("qwen3moe-q8_0", "expert_used_count", 9,
         r"'qwen3moe\.expert_used_count' = 9 exceeds 'qwen3moe\.expert_count' = 8"),
        ("gpt-oss-mxfp4", "expert_used_count", 16,
         r"'gpt-oss\.expert_used_count' = 16 exceeds 'gpt-oss\.expert_count' = 8"),
        ("qwen3moe-q8_0", "expert_count", 1 << 20,
         r"'qwen3moe\.expert_count' = 1048576 is out of range"),
        ("qwen3moe-q8_0", "expert_count", 16,
         r"'qwen3moe\.expert_count' = 16 disagrees with tensor 'blk\.0\.ffn_gate_inp\.weight'"),
        ("qwen3moe-q8_0", "expert_feed_forward_length", 1 << 30,
         r"'qwen3moe\.expert_feed_forward_length' = 1073741824 is out of range"),
        ("qwen3moe-q8_0", "expert_feed_forward_length", 128,
         r"tensor 'blk\.0\.ffn_gate_exps\.weight' has shape \[256, 256, 8\], but the metadata "
         r"implies \[256, 128, 8\]"),
    ],
)  # fmt: skip
def test_malformed_expert_metadata_is_named(tmp_path, golden_dir, model, key, value, match):
    arch = model.rsplit("-", 1)[0]
    src = golden_dir / "models" / f"{model}.gguf"
    g = _rewritten(tmp_path, src, set_kv=[_u32(f"{arch}.{key}", value)])
    with pytest.raises(ModelError, match=match):
        build_spec(g)


def test_missing_expert_count_is_named(tmp_path, golden_dir):
    src = golden_dir / "models" / "qwen3moe-q4_k_m.gguf"
    with pytest.raises(ModelError, match=r"metadata key 'qwen3moe\.expert_count' is missing"):
        build_spec(_rewritten(tmp_path, src, drop_keys=["qwen3moe.expert_count"]))


@pytest.mark.parametrize(
    "model, tensor, match",
    [
        # one expert short: the stacked tensor disagrees with the expert count
        ("qwen3moe-q8_0", "blk.1.ffn_down_exps.weight",
         r"'qwen3moe\.expert_count' = 8 disagrees with tensor 'blk\.1\.ffn_down_exps\.weight' "
         r"of shape \[256, 256, 7\]"),
        ("gpt-oss-mxfp4", "blk.0.ffn_up_exps.bias",
         r"tensor 'blk\.0\.ffn_up_exps\.bias' has shape \[128, 7\], but the metadata implies "
         r"\[128, 8\]"),
    ],
)  # fmt: skip
def test_expert_tensor_of_the_wrong_shape_is_named(tmp_path, golden_dir, model, tensor, match):
    def drop_last_expert(tensors):
        return [(n, d[:-1] if n == tensor else d, q) for n, d, q in tensors]

    src = golden_dir / "models" / f"{model}.gguf"
    with pytest.raises(ModelError, match=match):
        build_spec(_rewritten(tmp_path, src, edit_tensors=drop_last_expert))
