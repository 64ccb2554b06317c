"""Typed access to an architecture's GGUF metadata keys, with errors that name the key."""

from __future__ import annotations

from typing import Any

from forge.errors import ModelError
from forge.gguf import GGUFFile


class ArchMetadata:
    """Reads `<arch>.<key>` values of one file, checking presence and type."""

    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf
        self.arch = gguf.architecture
        self.md = gguf.metadata

    def _get(self, key: str, default: Any, kind: type) -> Any:
        full = f"{self.arch}.{key}"
        if full not in self.md:
            if default is _REQUIRED:
                raise ModelError(f"{self.gguf.path}: metadata key {full!r} is missing")
            return default
        value = self.md[full]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise ModelError(
                f"{self.gguf.path}: metadata key {full!r} should be {kind.__name__}, "
                f"got {type(value).__name__}"
            )
        return value

    def int(self, key: str, default: Any = None) -> int:
        return self._get(key, _REQUIRED if default is None else default, int)

    def count(self, key: str, default: Any = None) -> int:
        """An integer that must be >= 1 (a size or a count: dividing by it must be safe)."""
        value = self.int(key, default)
        if value < 1:
            absent = (
                " (absent: derived from other keys)" if f"{self.arch}.{key}" not in self.md else ""
            )
            raise ModelError(f"{self.gguf.path}: metadata key '{self.arch}.{key}' must be >= 1, "
                             f"got {value}{absent}")  # fmt: skip
        return value

    def float(self, key: str, default: Any = None) -> float:
        return self._get(key, _REQUIRED if default is None else default, float)

    def optional_float(self, key: str) -> float | None:
        return self._get(key, None, float)

    def name(self) -> str:
        name = self.md.get("general.name", "")
        return name if isinstance(name, str) else ""

    def n_vocab(self) -> int:
        tokens = self.md.get("tokenizer.ggml.tokens")
        if isinstance(tokens, list) and tokens:
            return len(tokens)
        return self.int("vocab_size")


_REQUIRED = object()
