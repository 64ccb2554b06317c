"""The cpu_simd mixture-of-experts block against a float64 reference written from the formulas
(weights through the `gguf` package's dequantizers), and its promises: tokens grouped by
expert, only the chosen experts read and prepared, nothing dequantized at load, a bounded cache.
"""

from __future__ import annotations

import numpy as np
import pytest
from forge_cpu_simd import experts as experts_mod
from forge_cpu_simd.experts import ExpertFFNBlock, swiglu_oai
from forge_cpu_simd.loading import layout
from forge_cpu_simd.plugin import CpuSimdBackend
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

import forge
from forge.errors import ConfigError
from forge.plugins import get_plugin_manager
from tests.support.moe_factory import N_USED, moe_model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{(arch, qtype name): forge.Model} of the synthetic MoE models."""
    d = tmp_path_factory.mktemp("moe")
    out = {}
    for arch in ("qwen3moe", "gpt-oss"):
        for qtype in (Q.F32, Q.MXFP4):
            path = moe_model(d / f"{arch}-{qtype.name}.gguf", arch, qtype)
            out[arch, qtype.name] = forge.load(str(path), backend="cpu_simd", n_ctx=64)
    return out


def _tensor(gguf, name) -> np.ndarray:
    """float64 weights in numpy order (GGML shape reversed), by gguf's dequantizer."""
    info = gguf.tensors[name]
    flat = dequantize(gguf.raw(name), Q[info.type]).astype(np.float64)
    return flat.reshape(tuple(reversed(info.shape)))


def _round_q8_0(x: np.ndarray) -> np.ndarray:
    return dequantize(quantize(x.astype(np.float32), Q.Q8_0), Q.Q8_0).astype(np.float64)


def reference_moe(model, layer: int, x: np.ndarray, round_acts: bool) -> np.ndarray:
    """The residual stream after layer `layer`'s experts, token by token in float64."""
    spec, g, p = model.spec, model.runner.gguf, f"blk.{layer}."
    f = spec.ffn
    opt = lambda name: _tensor(g, p + name) if p + name in g.tensors else None  # noqa: E731
    x = x.astype(np.float64)
    h = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + spec.rms_eps)
    h = h * _tensor(g, f"{p}{f.norm}.weight")
    logits = h @ _tensor(g, p + "ffn_gate_inp.weight").T
    if f.router_bias:
        logits += _tensor(g, p + "ffn_gate_inp.bias")
    gate_w, up_w, down_w = (_tensor(g, f"{p}ffn_{m}_exps.weight") for m in ("gate", "up", "down"))
    biases = [opt(f"ffn_{m}_exps.bias") for m in ("gate", "up", "down")]
    rnd = _round_q8_0 if round_acts else (lambda a: a)
    out = x.copy()
    for t in range(x.shape[0]):
        if f.gating == "softmax":
            probs = np.exp(logits[t] - logits[t].max())
            probs /= probs.sum()
            top = np.argsort(-probs, kind="stable")[: f.n_expert_used]
            w = probs[top] / (probs[top].sum() if f.norm_weights else 1.0)
        else:
            top = np.argsort(-logits[t], kind="stable")[: f.n_expert_used]
            w = np.exp(logits[t][top] - logits[t][top].max())
            w /= w.sum()
        for e, we in zip(top, w):
            hin = rnd(h[t : t + 1])[0]
            gate, up = gate_w[e] @ hin, up_w[e] @ hin
            if f.expert_bias:
                gate, up = gate + biases[0][e], up + biases[1][e]
            if f.activation == "silu":
                act = gate / (1 + np.exp(-gate)) * up
            else:
                gc, uc = (
                    np.minimum(gate, f.swiglu_limit),
                    np.clip(up, -f.swiglu_limit, f.swiglu_limit),
                )
                act = gc / (1 + np.exp(-f.swiglu_alpha * gc)) * (uc + 1)
            y = down_w[e] @ rnd(act[None])[0]
            out[t] += we * (y + (biases[2][e] if f.expert_bias else 0.0))
    return out


def _block(model, layer: int) -> ExpertFFNBlock:
    block = model.runner.blocks[layer][1]
    assert isinstance(block, ExpertFFNBlock)
    return block


def _hidden(rows: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_f32_block_equals_float64_reference(models, arch):
    model = models[arch, "F32"]
    x = _hidden(9)
    for layer in range(model.spec.n_layer):
        got = _block(model, layer)(x.copy())
        want = reference_moe(model, layer, x, round_acts=False)
        assert np.abs(got - want).max() < 2e-5 * np.abs(want).max()


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_mxfp4_experts_round_activations_as_llama_cpp(models, arch):
    """MXFP4 products see Q8_0-rounded activations (ggml_vec_dot_mxfp4_q8_0): ours are much
    closer to a reference that rounds them than to one that does not."""
    model = models[arch, "MXFP4"]
    x = _hidden(9, seed=2)
    got = _block(model, 0)(x.copy()).astype(np.float64)
    rounded = reference_moe(model, 0, x, round_acts=True)
    exact = reference_moe(model, 0, x, round_acts=False)
    err_rounded = np.abs(got - rounded).max()
    assert err_rounded < 1e-4 * np.abs(rounded).max()
    assert err_rounded * 20 < np.abs(got - exact).max()


def test_gpt_oss_routing_softmax_over_the_chosen():
    logits = np.array([[0.5, 3.0, -1.0, 2.0], [1.0, 1.0, 4.0, 0.0]], np.float32)
    block = ExpertFFNBlock.__new__(ExpertFFNBlock)
    from forge.models.spec import ExpertFFN

    block.f = ExpertFFN(n_expert=4, n_expert_used=2, n_ff=8, gating="softmax_chosen")
    chosen, weights = block.route(logits)
    assert chosen.tolist() == [[1, 3], [2, 0]]  # ties: the lower index first
    e = np.exp([3.0 - 2.0])[0]
    np.testing.assert_allclose(weights[0], [e / (e + 1), 1 / (e + 1)], rtol=1e-6)
    block.f = block.f.model_copy(update={"gating": "softmax", "norm_weights": False})
    _, unnormed = block.route(logits)
    probs = np.exp(logits[0] - 3.0) / np.exp(logits[0] - 3.0).sum()
    np.testing.assert_allclose(unnormed[0], probs[[1, 3]], rtol=1e-6)


def test_nothing_is_dequantized_at_load_and_a_step_prepares_only_its_experts(tmp_path, monkeypatch):
    seen = []
    original = experts_mod.ExpertMatrices.expert

    def spy(self, e):
        seen.append((self.info.name, e))
        return original(self, e)

    monkeypatch.setattr(experts_mod.ExpertMatrices, "expert", spy)
    path = moe_model(tmp_path / "m.gguf", "gpt-oss", Q.MXFP4)
    model = forge.load(str(path), backend="cpu_simd", n_ctx=64)
    blocks = [_block(model, i) for i in range(model.spec.n_layer)]
    assert not seen and all(b.cache.prepared == 0 and b.cache.nbytes == 0 for b in blocks)
    model.logits(model.tokenize("ab"))  # one token
    for i, b in enumerate(blocks):
        read = {e for name, e in seen if name.startswith(f"blk.{i}.")}
        assert b.cache.prepared == len(read) == N_USED  # the chosen ones, and no other
        assert all(e in b.cache for e in read)


def test_tokens_are_grouped_one_product_per_chosen_expert(models, monkeypatch):
    model = models["qwen3moe", "F32"]
    block = _block(model, 1)
    calls = []
    original = ExpertFFNBlock._expert

    def spy(self, e, h):
        calls.append((e, h.shape[0]))
        return original(self, e, h)

    monkeypatch.setattr(ExpertFFNBlock, "_expert", spy)
    x = _hidden(16, seed=3)
    block(x)
    chosen, _ = block.route(block.router(model.runner.ops.rms_norm(x, block.norm, block.eps)))
    want = {int(e): int((chosen == e).sum()) for e in np.unique(chosen)}
    assert dict(calls) == want and len(calls) == len(want)


def test_a_tiny_cache_gives_the_same_logits(tmp_path, monkeypatch, models):
    path = moe_model(tmp_path / "m.gguf", "gpt-oss", Q.MXFP4)
    ids = models["gpt-oss", "MXFP4"].tokenize("ab an al ys is")
    want = forge.load(str(path), backend="cpu_simd", n_ctx=64).logits(ids)
    monkeypatch.setenv("FORGE_CPU_EXPERT_CACHE_MB", "0")  # the config key cpu_expert_cache_mb
    small = forge.load(str(path), backend="cpu_simd", n_ctx=64)
    np.testing.assert_array_equal(small.logits(ids), want)
    for i in range(small.spec.n_layer):
        cache = _block(small, i).cache
        assert len(cache._items) == 1 and cache.prepared > N_USED  # evicted and prepared again


def test_bad_cache_size_is_a_config_error(tmp_path, monkeypatch):
    path = moe_model(tmp_path / "m.gguf", "qwen3moe", Q.F32)
    monkeypatch.setenv("FORGE_CPU_EXPERT_CACHE_MB", "lots")
    with pytest.raises(ConfigError, match=r"cpu_expert_cache_mb: .*'lots' .*FORGE_CPU_EXPERT"):
        forge.load(str(path), backend="cpu_simd", n_ctx=64)
    with pytest.raises(ConfigError, match=r"cpu_expert_cache_mb: .*greater than or equal to 0"):
        forge.load(str(path), backend="cpu_simd", n_ctx=64, config={"cpu_expert_cache_mb": -1})


def test_the_cache_size_reaches_the_memory_estimate(tmp_path):
    """forge inspect's estimate counts the prepared experts up to cpu_expert_cache_mb."""
    from forge_cpu_simd.plugin import CpuSimdBackend

    from forge.gguf import open_gguf
    from forge.models import build_spec

    gguf = open_gguf(str(moe_model(tmp_path / "m.gguf", "qwen3moe", Q.F32)))
    spec = build_spec(gguf)
    stored = sum(t.nbytes for n, t in gguf.tensors.items() if "_exps." in n)
    backend = CpuSimdBackend()
    none = backend.memory_needed(spec, gguf, 64, expert_cache_mb=0)["weights"]
    full = backend.memory_needed(spec, gguf, 64)["weights"]
    assert full - none == stored  # F32 experts: all of them fit the default 2048 MiB


def test_swiglu_oai_clamps_as_gpt_oss():
    gate = np.array([-30.0, -1.0, 0.0, 2.0, 7.0, 50.0], np.float32)
    up = np.array([-50.0, -8.0, 0.5, 1.0, 6.0, 9.0], np.float32)
    got = swiglu_oai(gate, up, 1.702, 7.0)
    g = np.minimum(gate.astype(np.float64), 7.0)
    u = np.clip(up.astype(np.float64), -7.0, 7.0)
    want = g / (1 + np.exp(-1.702 * g)) * (u + 1)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    assert got[-1] == pytest.approx(got[-2] * 8 / 7)  # gate clamped at 7, up at 7


def test_memory_needed_counts_every_expert(models):
    model = models["qwen3moe", "MXFP4"]
    g, spec = model.runner.gguf, model.spec
    need = CpuSimdBackend().memory_needed(spec, g, 64)
    expert_names = [n for n in g.tensors if "_exps.weight" in n]
    stored = sum(g.tensors[n].nbytes for n in expert_names)
    kernels = get_plugin_manager().kernels

    def dense_bytes(name: str) -> int:  # a matrix as its winning kernel keeps it
        info = g.tensors[name]
        won = kernels.get("cpu_simd", "matmul", info.type) if len(info.shape) == 2 else None
        return info.nbytes if won and layout(won.impl) == "gguf" else info.n_elements * 4

    dense = sum(dense_bytes(n) for n in g.tensors
                if n not in expert_names and n != "token_embd.weight")  # fmt: skip
    f32_experts = sum(g.tensors[n].n_elements * 4 for n in expert_names)
    assert need["weights"] == dense + stored + f32_experts  # the cache bound is above them
