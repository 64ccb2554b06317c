"""On-disk cache of compiled kernels, keyed by (source hash, arch, compiler version, flags)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


def cache_dir() -> Path:
    """$FORGE_CACHE_DIR, else ~/.cache/forge/kernels."""
    env = os.environ.get("FORGE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "forge" / "kernels"


def cache_key(source: str, arch: str, compiler: str, flags: Sequence[str]) -> str:
    """A file-name-safe digest of everything that changes the compiled code."""
    h = hashlib.sha256()
    for part in (source, arch, compiler, "\0".join(flags)):
        h.update(part.encode())
        h.update(b"\1")
    return f"{arch}-{h.hexdigest()[:40]}"


def cached_compile(
    source: str,
    arch: str,
    compiler: str,
    flags: Sequence[str],
    compile_fn: Callable[[], bytes],
    directory: Path | None = None,
) -> bytes:
    """Return the cached code object for this key, or run `compile_fn` and store its result.

    Writes go to a temporary file renamed into place, so concurrent processes never read a
    half-written entry. An unwritable cache directory only costs the caching.
    """
    root = directory or cache_dir()
    path = root / (cache_key(source, arch, compiler, flags) + ".bin")
    try:
        data = path.read_bytes()
        if data:
            return data
    except OSError:
        pass
    data = compile_fn()
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass
    return data
