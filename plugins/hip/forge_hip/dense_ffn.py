"""The dense FFN of the hip plan: the gate/up product with the activation fused, then the down
product (`forge_hip.products` picks each one's kernel path). `forge_hip.experts` is the other
FFN kind; both give the plan a part per layer and run it over ws.h into ws.o."""

from __future__ import annotations

from dataclasses import dataclass

from forge.models.spec import DenseFFN, ModelSpec
from forge_hip.products import Fused, Products
from forge_hip.workspace import Workspace

ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # the gated kernels' act argument


@dataclass(frozen=True)
class DenseFFNLaunches:
    """One layer's dense FFN part: its descriptors and vector weights (0: absent)."""

    norm: int  # ffn_norm.weight
    gate_up: int  # first of the gate, up descriptors
    down: int
    post_norm: int
    act: int  # ACTIVATIONS

    @property
    def first_product(self) -> tuple[int, int, bool]:
        """(first descriptor, count, whether the add_norm making x may fuse into it) of the
        product reading this part's input."""
        return self.gate_up, 2, True


class DenseFFNs:
    """Descriptors and launches of the dense FFN parts of one model."""

    def __init__(self, spec: ModelSpec, products: Products, ws: Workspace):
        if not isinstance(spec.ffn, DenseFFN):
            raise TypeError("DenseFFNs needs a model whose FFN is dense")
        self.spec, self.products, self.ws = spec, products, ws

    def part(self, prefix: str) -> DenseFFNLaunches:
        """Descriptors of one layer's FFN (prefix "blk.<i>.")."""
        ws, v = self.ws, self.products.arena.address
        gate_up = self.products.add([(prefix + "ffn_gate.weight", ws.h, ws.g, 0),
                                     (prefix + "ffn_up.weight", ws.h, ws.u, 0)])  # fmt: skip
        down = self.products.add([(prefix + "ffn_down.weight", ws.g, ws.o, 0)])
        return DenseFFNLaunches(v(prefix + "ffn_norm.weight"), gate_up, down,
                                v(prefix + "post_ffw_norm.weight"),
                                ACTIVATIONS[self.spec.ffn.activation])  # fmt: skip

    def run(self, part: DenseFFNLaunches, rows: int, norm: Fused | None) -> None:
        """The FFN over `rows` rows of ws.h (or of the add_norm `norm` leaves to the gate/up
        launch) into ws.o."""
        self.products.glu(part.gate_up, rows, part.act, norm)
        self.products.matmul(part.down, 1, rows)
