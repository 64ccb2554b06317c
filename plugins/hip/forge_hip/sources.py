"""Kernel sources: where kernels/*.hip live and how they become one self-contained text.

Run-time compilers get no include path (NVRTC has no system headers, hiprtc none of ours), so
`#include "x.h"` lines are inlined here, each file once: from the source's own directory, else
forge's kernel directory (a third-party kernel may include forge_hip.h, contract.h, quants.h).
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

from forge.errors import ForgeRuntimeError

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$", re.MULTILINE)


def kernel_dir() -> Path:
    """$FORGE_KERNEL_DIR, else kernels/ shipped inside the package, else the checkout's kernels/."""
    env = os.environ.get("FORGE_KERNEL_DIR")
    here = Path(__file__).resolve().parent
    for cand in ([Path(env)] if env else []) + [here / "kernels", here.parents[2] / "kernels"]:
        if (cand / "forge_hip.h").exists():
            return cand
    raise ForgeRuntimeError(
        "HIP kernel sources not found: set FORGE_KERNEL_DIR to the directory holding forge_hip.h"
    )


def source_names(directory: str | None = None) -> list[str]:
    """Every kernel source file name (*.hip) in `directory` (None: the kernel directory)."""
    return sorted(p.name for p in Path(directory or kernel_dir()).glob("*.hip"))


@lru_cache(maxsize=64)
def load_source(name: str, directory: str | None = None) -> str:
    """The text of `name` with local includes inlined (each header once, in order)."""
    root = Path(directory) if directory else kernel_dir()
    seen: set[str] = set()

    def expand(fname: str) -> str:
        path = root / fname
        if not path.is_file() and fname.endswith(".h") and directory:
            path = kernel_dir() / fname  # one of forge's headers
        if not path.is_file():
            raise ForgeRuntimeError(f"kernel source {fname!r} not found in {root}")
        if fname in seen:
            return ""
        seen.add(fname)
        text = _PRAGMA_ONCE.sub("", path.read_text())
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    return expand(name)
