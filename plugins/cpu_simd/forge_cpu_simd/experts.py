"""The mixture-of-experts FFN of cpu_simd (`forge.models.spec.ExpertFFN`).

The stacked expert matrices stay in the memory-mapped GGUF file as they are stored: a mixture's
experts are most of its weights (Qwen3-30B-A3B's would take over 100 GB as float32). An expert
is prepared by the matmul kernel only when a token is routed to it, and a per-layer LRU keeps the
recently used ones (`ExpertCache`, bounded by the config key cpu_expert_cache_mb over all
layers). Tokens are grouped by expert, so each chosen expert runs one product per matrix over
just its tokens, and a decode step touches only the experts it chose.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

import numpy as np

from forge.gguf import GGUFFile, TensorInfo
from forge.models.spec import ExpertFFN, ModelSpec
from forge.models.weights import model_weights
from forge_cpu_simd.loading import Linear, Stacked, WeightLoader, prepare_linear


def expert_memory(spec: ModelSpec, gguf: GGUFFile, cache_bytes: int) -> tuple[int, int]:
    """(bytes of every expert matrix as stored in the file, which the runner maps and reads,
    bytes its caches of prepared experts can grow to: at most `cache_bytes`)."""
    stored = f32 = 0
    for name, w in model_weights(spec).items():
        if w.kind == "experts":
            stored += gguf.tensors[name].nbytes
            f32 += gguf.tensors[name].n_elements * 4
    return stored, min(f32, cache_bytes)


class ExpertMatrices:
    """One stacked expert tensor [K, N, n_expert] of the file: expert e is rows
    [e * N, (e + 1) * N) of its bytes, a matrix of its own."""

    def __init__(self, gguf: GGUFFile, name: str):
        self.info = gguf.tensors[name]
        self.raw = gguf.raw(name)  # uint8 [n_expert * N, row bytes], memory-mapped
        k, self.n_out, self.n_expert = self.info.shape
        self.slice_bytes = self.n_out * self.raw.shape[1]
        self._shape = (k, self.n_out)

    def expert(self, e: int) -> tuple[np.ndarray, TensorInfo]:
        """Expert `e`'s bytes and a TensorInfo describing them as one 2-D matrix."""
        info = replace(self.info, name=f"{self.info.name}[{e}]", shape=self._shape,
                       offset=self.info.offset + e * self.slice_bytes,
                       nbytes=self.slice_bytes)  # fmt: skip
        return self.raw[e * self.n_out : (e + 1) * self.n_out], info

    @property
    def nbytes(self) -> int:
        return self.info.nbytes


class ExpertCache:
    """The prepared (gate+up, down) products of recently used experts of one layer, least
    recently used dropped first once their bytes exceed the budget (the last one prepared is
    always kept: a step needs it)."""

    def __init__(self, budget: int):
        self.budget = budget
        self._items: OrderedDict[int, tuple[Linear | Stacked, Linear | Stacked]] = OrderedDict()
        self.nbytes = 0
        self.prepared = 0  # experts prepared so far (misses)

    def get(self, e: int, make) -> tuple[Linear | Stacked, Linear | Stacked]:  # noqa: ANN001
        item = self._items.get(e)
        if item is not None:
            self._items.move_to_end(e)
            return item
        item = make(e)
        self.prepared += 1
        self._items[e] = item
        self.nbytes += item[0].nbytes + item[1].nbytes
        while self.nbytes > self.budget and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self.nbytes -= old[0].nbytes + old[1].nbytes
        return item

    def __contains__(self, e: int) -> bool:
        return e in self._items


class ExpertFFNBlock:
    """Router, top-k choice and the chosen experts' gated FFNs, summed with their weights."""

    def __init__(self, spec: ModelSpec, load: WeightLoader, prefix: str, ops_):
        f: ExpertFFN = spec.ffn
        self.f, self.eps, self.ops, self.kernels = f, spec.rms_eps, ops_, load.kernels
        self.norm = load.vector(f"{prefix}{f.norm}.weight")
        router_bias = [prefix + "ffn_gate_inp.bias"] if f.router_bias else None
        self.router = load.linear([prefix + "ffn_gate_inp.weight"], router_bias)
        self.gate, self.up, self.down = (
            ExpertMatrices(load.gguf, f"{prefix}ffn_{m}_exps.weight")
            for m in ("gate", "up", "down")
        )
        self.bias = None
        if f.expert_bias:  # [n_expert, N] each
            self.bias = tuple(
                load.vector(f"{prefix}ffn_{m}_exps.bias").reshape(f.n_expert, -1)
                for m in ("gate", "up", "down")
            )
        self.cache = ExpertCache(load.expert_cache_bytes // spec.n_layer)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x [rows, n_embd] -> the residual stream after the mixture."""
        h = self.ops.rms_norm(x, self.norm, self.eps)
        chosen, weights = self.route(self.router(h))  # [rows, k] each
        out = np.zeros_like(x)
        flat = chosen.ravel()
        order = np.argsort(flat, kind="stable")  # the (token, slot) pairs grouped by expert
        experts, starts = np.unique(flat[order], return_index=True)
        ends = np.append(starts[1:], flat.size)
        k = chosen.shape[1]
        for e, lo, hi in zip(experts.tolist(), starts.tolist(), ends.tolist()):
            pairs = order[lo:hi]
            rows = pairs // k  # each token at most once per expert
            y = self._expert(e, h[rows])
            out[rows] += weights.ravel()[pairs, None] * y
        return x + out

    def route(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(expert ids, float32 weights), each [rows, n_expert_used], best expert first."""
        f = self.f
        logits = logits.astype(np.float32, copy=False)
        if f.gating == "softmax":
            scores = _softmax(logits)
            chosen = _top_k(scores, f.n_expert_used)
            weights = np.take_along_axis(scores, chosen, axis=1)
            if f.norm_weights:
                # llama.cpp clamps the sum at the smallest f16 normal before dividing
                weights = weights / np.maximum(weights.sum(axis=1, keepdims=True), 6.103515625e-5)
        else:
            chosen = _top_k(logits, f.n_expert_used)
            weights = _softmax(np.take_along_axis(logits, chosen, axis=1))
        if f.weights_scale != 1.0:
            weights = weights * np.float32(f.weights_scale)
        return chosen, weights.astype(np.float32, copy=False)

    def _expert(self, e: int, h: np.ndarray) -> np.ndarray:
        gate_up, down = self.cache.get(e, self._prepare)
        gate, up = gate_up(h)
        if self.bias is not None:
            gate = gate + self.bias[0][e]
            up = up + self.bias[1][e]
        y = down(self._activate(gate, up))
        return y + self.bias[2][e] if self.bias is not None else y

    def _prepare(self, e: int) -> tuple[Linear | Stacked, Linear | Stacked]:
        gate_up = prepare_linear(self.kernels, [self.gate.expert(e), self.up.expert(e)], None)
        return gate_up, prepare_linear(self.kernels, [self.down.expert(e)], None)

    def _activate(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        if self.f.activation == "silu":
            return self.ops.silu(gate) * up
        return swiglu_oai(gate, up, self.f.swiglu_alpha, self.f.swiglu_limit)

    @property
    def nbytes(self) -> int:
        """Bytes of the dense weights, the mapped experts and the prepared ones held now."""
        mapped = self.gate.nbytes + self.up.nbytes + self.down.nbytes
        bias = sum(b.nbytes for b in self.bias) if self.bias is not None else 0
        return self.norm.nbytes + self.router.nbytes + bias + mapped + self.cache.nbytes


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's clamped SwiGLU: g * sigmoid(alpha * g) * (u + 1) with g = min(gate, limit)
    and u = clip(up, -limit, limit)."""
    g = np.minimum(gate, np.float32(limit))
    u = np.clip(up, np.float32(-limit), np.float32(limit))
    with np.errstate(over="ignore"):  # exp overflows to inf for very negative g: the result is 0
        return g / (np.float32(1.0) + np.exp(np.float32(-alpha) * g)) * (u + np.float32(1.0))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores of each row, largest first (ties: lowest index)."""
    order = np.argsort(-scores, axis=1, kind="stable")
    return order[:, :k]
