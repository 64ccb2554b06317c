"""The kernel table: which implementation runs each (backend, op, weight type).

Kernels come from plugins through `forge_register_kernels`; the built-in backends register theirs
the same way. For one key the highest priority wins; ties go to the later registration, so a
third-party plugin that registers at the built-in priority still does not silently lose.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ANY_TYPE = "*"  # weight_type for kernels that take no weights or accept every type
INVARIANT_BOOST = 1 << 20  # priority added to batch-invariant kernels under batch_invariant


@dataclass(frozen=True)
class KernelSpec:
    """One registered kernel implementation."""

    backend: str  # backend name, e.g. "cpu_simd"
    op: str  # op name, e.g. "matmul", "rms_norm", "attention"
    weight_type: str  # GGML type name ("Q4_K") or ANY_TYPE
    impl: Any  # backend-defined object (a callable, a kernel source descriptor, ...)
    priority: int = 0  # higher wins
    plugin: str = ""  # name of the plugin that registered it (filled in by the manager)


class KernelTable:
    """All registered kernels, with lookup of the winner per key."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str, str], list[KernelSpec]] = {}
        # set by batch_invariant(): backends whose launch plans choose reduction orders by the
        # batch (hip) fix them while it is set
        self.invariant = False

    def add(self, spec: KernelSpec) -> None:
        self._by_key.setdefault((spec.backend, spec.op, spec.weight_type), []).append(spec)

    def candidates(self, backend: str, op: str, weight_type: str = ANY_TYPE) -> list[KernelSpec]:
        """All kernels for a key, the winner first."""
        found = self._by_key.get((backend, op, weight_type), [])
        if not found and weight_type != ANY_TYPE:
            found = self._by_key.get((backend, op, ANY_TYPE), [])
        order = sorted(enumerate(found), key=lambda p: (p[1].priority, p[0]), reverse=True)
        return [k for _, k in order]

    def get(self, backend: str, op: str, weight_type: str = ANY_TYPE) -> KernelSpec | None:
        """The winning kernel for a key (falling back to the op's any-type kernel), or None."""
        found = self.candidates(backend, op, weight_type)
        return found[0] if found else None

    def require(self, backend: str, op: str, weight_type: str = ANY_TYPE) -> KernelSpec:
        """Like `get`, but raises UnsupportedModelError naming the missing kernel."""
        from forge.errors import UnsupportedModelError

        found = self.get(backend, op, weight_type)
        if found is None:
            raise UnsupportedModelError(
                f"backend {backend!r} has no kernel for op {op!r} on weight type {weight_type}"
            )
        return found

    def keys(self) -> list[tuple[str, str, str]]:
        return sorted(self._by_key)

    def batch_invariant(self) -> KernelTable:
        """The table where, for each key, kernels marked `batch_invariant = True` (whose result
        for a row does not depend on the other rows of the call) win over the others, whatever
        their priority. What the config key ``batch_invariant = true`` runs."""
        table = KernelTable()
        for specs in self._by_key.values():
            for spec in specs:
                if getattr(spec.impl, "batch_invariant", False):
                    spec = dataclasses.replace(spec, priority=spec.priority + INVARIANT_BOOST)
                table.add(spec)
        table.invariant = True
        return table

    def builtin_only(self, owners: dict[str, str]) -> KernelTable:
        """The table with, for each backend, only the kernels its own plugin registered
        (`owners`: backend name -> plugin name); backends not in `owners` keep every kernel.
        What the config key ``kernels = "builtin"`` runs: NumPy on cpu_simd."""
        table = KernelTable()
        for specs in self._by_key.values():
            for spec in specs:
                owner = owners.get(spec.backend)
                if owner is None or spec.plugin == owner:
                    table.add(spec)
        table.invariant = self.invariant
        return table
