"""forge: run LLMs stored as GGUF files through pluggable backends.

The core knows models, tokens, sampling and serving; execution comes from backend plugins
(`forge_cpu_simd`, `forge_hip`, or any package registering in the entry-point group ``forge``).
"""

from __future__ import annotations

from importlib import metadata as _metadata
from typing import Any

from forge.hookspecs import HOOK_API_VERSION, hookimpl

try:
    __version__ = _metadata.version("forge-llm")
except _metadata.PackageNotFoundError:  # running from a checkout that was not pip-installed
    __version__ = "0.0.0+unknown"

__all__ = ["HOOK_API_VERSION", "Model", "__version__", "hookimpl", "load"]


# --- public model API (owned by the engine; imported lazily) -------------------------------------
# `forge.load` and `forge.Model` live in forge.api; importing them lazily keeps `import forge`
# cheap and working while that module is being written.
def __getattr__(name: str) -> Any:
    if name in ("load", "Model"):
        from forge import api

        return getattr(api, name)
    raise AttributeError(f"module 'forge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "load", "Model"})
