"""A rank's view of a tensor-parallel model (forge.shard_view): the sizes it computes and the
weights it reads make, summed over ranks, the whole model's layer. Checked in float64 against
the whole file's weights through the gguf package's dequantizer (an independent decoder)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from forge.gguf import open_gguf
from forge.models import build_spec
from forge.models.weights import expected_shapes
from forge.shard_view import ShardView, rank_spec
from forge.sharding import ShardPlan

CASES = [("llama-q8_0.gguf", 2), ("llama-q8_0.gguf", 4), ("llama-q4_0.gguf", 2),
         ("gemma3-f16.gguf", 2), ("gemma3-f16.gguf", 4), ("qwen3-q8_0.gguf", 2)]  # fmt: skip


def _matrix(source, name: str) -> np.ndarray:
    """A weight as float64 [rows, row length] (a vector: [1, n])."""
    info = source.tensors[name]
    values = dequantize(np.asarray(source.raw(name)), GGMLQuantizationType[info.type])
    return values.astype(np.float64).reshape(-1, info.shape[0])


def _layer_parts(spec, source, i: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Layer i's attention output product and FFN output (before any residual add or norm)
    for rows h, causal attention without RoPE: the sizes from `spec`, the weights from
    `source`."""
    p = f"blk.{i}."
    w = lambda n: _matrix(source, p + n)  # noqa: E731
    bias = lambda n: _matrix(source, p + n)[0] if p + n in source.tensors else 0.0  # noqa: E731
    d, dv, t = spec.head_dim, spec.head_dim_v, len(h)
    q = (h @ w("attn_q.weight").T + bias("attn_q.bias")).reshape(t, spec.n_head, d)
    k = (h @ w("attn_k.weight").T + bias("attn_k.bias")).reshape(t, spec.n_head_kv, d)
    v = (h @ w("attn_v.weight").T + bias("attn_v.bias")).reshape(t, spec.n_head_kv, dv)
    group = spec.n_head // spec.n_head_kv
    heads = []
    for hd in range(spec.n_head):
        s = q[:, hd] @ k[:, hd // group].T * spec.attn_scale
        s[np.triu_indices(t, 1)] = -np.inf
        e = np.exp(s - s.max(axis=1, keepdims=True))
        heads.append(e / e.sum(axis=1, keepdims=True) @ v[:, hd // group])
    attn = np.concatenate(heads, axis=1) @ w("attn_output.weight").T
    g, u = h @ w("ffn_gate.weight").T, h @ w("ffn_up.weight").T
    ffn = (g / (1 + np.exp(-g)) * u) @ w("ffn_down.weight").T
    return attn, ffn


@pytest.mark.parametrize("name,world", CASES)
def test_ranks_parts_sum_to_the_whole_layer(golden_dir, name, world):
    gguf = open_gguf(golden_dir / "models" / name)
    spec = build_spec(gguf)
    plan = ShardPlan.build(spec, gguf, world)
    h = np.random.default_rng(0).standard_normal((5, spec.n_embd))
    whole = [_layer_parts(spec, gguf, i, h) for i in (0, spec.n_layer - 1)]
    head = "token_embd.weight" if spec.tied_output else "output.weight"
    logits = h @ _matrix(gguf, head).T
    sums = [[np.zeros_like(a), np.zeros_like(f)] for a, f in whole]
    shard_logits = []
    for rank in range(world):
        rs, view = rank_spec(spec, plan, rank), ShardView(gguf, spec, plan, rank)
        # the rank's tensors have exactly the shapes its sizes call for; its head, its rows
        shapes = expected_shapes(rs)
        shapes["output.weight"] = (spec.n_embd, len(plan.vocab[rank]))
        assert {n: view.tensors[n].shape for n in shapes} == shapes
        for n in shapes:
            assert view.raw(n).nbytes == view.tensors[n].nbytes, n
        for parts, i in zip(sums, (0, spec.n_layer - 1)):
            attn, ffn = _layer_parts(rs, view, i, h)
            parts[0] += attn
            parts[1] += ffn
        shard_logits.append(h @ _matrix(view, "output.weight").T)
        assert rs.n_head * world == spec.n_head and rs.ffn.n_ff * world == spec.ffn.n_ff
        assert view.raw("token_embd.weight").shape == gguf.raw("token_embd.weight").shape
    for (a, f), (sa, sf) in zip(whole, sums):
        np.testing.assert_allclose(sa, a, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(sf, f, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.concatenate(shard_logits, axis=1), logits, rtol=1e-9, atol=1e-12)
    assert [s.shape[1] for s in shard_logits] == [len(v) for v in plan.vocab]


def test_a_rows_split_is_a_view_of_the_mapped_file(golden_dir):
    gguf = open_gguf(golden_dir / "models" / "llama-q8_0.gguf")
    spec = build_spec(gguf)
    view = ShardView(gguf, spec, ShardPlan.build(spec, gguf, 2), 1)
    part = view.raw("blk.0.ffn_up.weight")
    assert not part.flags.owndata and np.shares_memory(part, gguf.raw("blk.0.ffn_up.weight"))
    assert part.shape[0] == spec.ffn.n_ff // 2
