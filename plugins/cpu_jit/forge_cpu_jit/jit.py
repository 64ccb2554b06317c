"""Compiling the kernels: numba's on-disk cache in the user's cache directory, the progress line
of a first compile, and the one-time message when the compiled kernels cannot be used.

Importing this module imports numba and the kernel modules (their functions compile lazily, on
first use). `compile_types(types)` compiles, or loads from the cache, what the listed weight types
need, by running each function once on tiny inputs of the exact argument types the products use.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("forge")

PACKAGE_DIR = Path(__file__).resolve().parent


def cache_root() -> Path:
    """$FORGE_CACHE_DIR/cpu_jit, else $XDG_CACHE_HOME/forge/cpu_jit (default ~/.cache)."""
    env = os.environ.get("FORGE_CACHE_DIR")
    if env:
        return Path(env) / "cpu_jit"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "forge" / "cpu_jit"


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def _choose_cache_dir() -> Path:
    """The user's cache directory, or (unwritable) a per-user temporary one."""
    root = cache_root()
    if _writable(root):
        return root
    fallback = Path(tempfile.gettempdir()) / f"forge-cpu_jit-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    log.warning("forge cpu_jit: cannot write the kernel cache %s; using %s", root, fallback)
    return fallback


CACHE_DIR = _choose_cache_dir()


def _install_locator() -> None:
    """numba caches the functions of this package in CACHE_DIR, never beside the installed
    sources (which may be read-only, or shared by several users)."""
    from numba.core import caching

    mixin = caching._SourceFileBackedLocatorMixin
    base = caching._CacheLocator

    class ForgeCacheLocator(mixin, base):
        def __init__(self, py_func, py_file):  # noqa: ANN001
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            digest = hashlib.sha1(str(Path(py_file).parent).encode()).hexdigest()[:16]
            self._cache_path = str(CACHE_DIR / digest)

        def get_cache_path(self) -> str:
            return self._cache_path

        @classmethod
        def from_function(cls, py_func, py_file):  # noqa: ANN001, ANN206
            try:
                if Path(py_file).resolve().parent != PACKAGE_DIR:
                    return None
            except OSError:
                return None
            return super().from_function(py_func, py_file)

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # renamed in numba 0.59
    if not any(getattr(c, "__name__", "") == "ForgeCacheLocator" for c in impl._locator_classes):
        impl._locator_classes.insert(0, ForgeCacheLocator)


_install_locator()

import numpy as np  # noqa: E402

from forge_cpu_jit import gemm, quant  # noqa: E402

# The activation rounding each weight type's products use (llama.cpp's vec_dot partner type).
ACT_KIND = {
    "F32": "f32", "F16": "f16", "BF16": "bf16",
    "Q4_0": "q8_0", "Q4_1": "q8_0", "Q5_0": "q8_0", "Q5_1": "q8_0", "Q8_0": "q8_0",
    "Q2_K": "q8_k", "Q3_K": "q8_k", "Q4_K": "q8_k", "Q5_K": "q8_k", "Q6_K": "q8_k",
}  # fmt: skip
FLOAT_MODE = {"f32": 0, "f16": 1, "bf16": 2}
BLOCK = {"F32": 1, "F16": 1, "BF16": 1, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32,
         "Q8_0": 32, "Q2_K": 256, "Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}  # fmt: skip
ROW_BYTES_PER_BLOCK = {"F32": 4, "F16": 2, "BF16": 2, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22,
                       "Q5_1": 24, "Q8_0": 34, "Q2_K": 84, "Q3_K": 110, "Q4_K": 144,
                       "Q5_K": 176, "Q6_K": 210}  # fmt: skip
TYPES = tuple(ACT_KIND)


def threads() -> int:
    """Threads the products use: numba's (NUMBA_NUM_THREADS, default every core)."""
    import numba

    return numba.get_num_threads()


def padded(k: int) -> int:
    """Row length padded to the kernels' 64-weight chunks."""
    return -(-k // 64) * 64


def act_buffers(rows: int, k: int, kind: str) -> tuple[np.ndarray, ...]:
    """Empty activation buffers of a kind for `rows` rows of length k (padding zeroed)."""
    kp = padded(k)
    alloc = np.zeros if kp != k else np.empty
    if kind in FLOAT_MODE:
        return (alloc((rows, kp), np.float32),)
    return (alloc((rows, kp), np.int8), alloc((rows, kp // 4), np.float32),
            alloc((rows, kp // 4), np.int32), alloc((rows, kp // 4), np.float32))  # fmt: skip


def quantize_rows(kind: str, x: np.ndarray, bufs: tuple[np.ndarray, ...], lo: int, hi: int) -> None:
    if kind == "q8_0":
        quant.q8_0_rows(x, *bufs, lo, hi)
    elif kind == "q8_k":
        quant.q8_k_rows(x, *bufs, lo, hi)
    else:
        quant.round_rows(x, bufs[0], FLOAT_MODE[kind], lo, hi)


def product(type_name: str, raw: np.ndarray, bufs: tuple[np.ndarray, ...], out: np.ndarray,
            col0: int, threads: int) -> None:  # fmt: skip
    """Every weight row of `raw` by the activations in `bufs`, into out[:, col0 : col0 + rows],
    the rows split over `threads` threads (numba's pool: one fork and join, no GIL)."""
    kind = ACT_KIND[type_name]
    if kind in FLOAT_MODE:
        gemm.run_float(raw, FLOAT_MODE[kind], bufs[0], out, col0, threads)
    else:
        gemm.RUN[type_name](raw, *bufs, out, col0, threads)


# -- compiling --------------------------------------------------------------------------------

_state: dict[str, bool | str] = {}  # weight type -> True (ready) or the error that stopped it
_lock = threading.Lock()
PROGRESS_AFTER_S = 0.5  # a compile (not a cache load) is announced once it takes this long


def _exercise(type_name: str) -> None:
    """Run the quantizer and the product of a type once on tiny inputs (read-only mapped-like
    weights, as `GGUFFile.raw` gives them): compiles or loads exactly what the model will call."""
    kind = ACT_KIND[type_name]
    k = 256 if BLOCK[type_name] == 256 else 64
    row_bytes = k // BLOCK[type_name] * ROW_BYTES_PER_BLOCK[type_name]
    raw = np.frombuffer(bytes(row_bytes * 4), np.uint8).reshape(4, row_bytes)  # read-only
    for rows in (1, 2):  # one activation row (decode) and several (prefill, batches)
        x = np.zeros((rows, k), np.float32)
        bufs = act_buffers(rows, k, kind)
        quantize_rows(kind, x, bufs, 0, rows)
        product(type_name, raw, bufs, np.zeros((rows, 4), np.float32), 0, 1)


class _Progress:
    """A status line on stderr, shown only if compiling takes longer than PROGRESS_AFTER_S."""

    def __init__(self, names: list[str]):
        self.names, self.done, self.shown, self.t0 = names, 0, False, time.perf_counter()
        self._timer = threading.Timer(PROGRESS_AFTER_S, self._show)
        self._timer.daemon = True
        self._timer.start()

    def _line(self) -> str:
        return (f"forge cpu_jit: compiling the CPU kernels for {', '.join(self.names)} "
                f"[{self.done}/{len(self.names)}] (first run only; cached in {CACHE_DIR})")  # fmt: skip

    def _show(self) -> None:
        self.shown = True
        self._write(self._line())

    def _write(self, text: str) -> None:
        tty = sys.stderr.isatty()
        sys.stderr.write(("\r\x1b[K" if tty else "") + text + ("" if tty else "\n"))
        sys.stderr.flush()

    def step(self) -> None:
        self.done += 1
        if self.shown and sys.stderr.isatty():
            self._write(self._line())

    def close(self) -> None:
        self._timer.cancel()
        if self.shown:
            took = time.perf_counter() - self.t0
            self._write(f"forge cpu_jit: compiled the CPU kernels for {', '.join(self.names)} "
                        f"in {took:.1f} s (cached for later runs)")  # fmt: skip
            if sys.stderr.isatty():
                sys.stderr.write("\n")


def compile_types(type_names) -> dict[str, bool | str]:  # noqa: ANN001
    """Make the kernels of these weight types ready; returns {type: True or error text}."""
    with _lock:
        todo = sorted({t for t in type_names if t in ACT_KIND and t not in _state})
        if todo:
            progress = _Progress(todo)
            try:
                for name in todo:
                    try:
                        _exercise(name)
                        _state[name] = True
                    except Exception as exc:  # a numba or LLVM failure: NumPy takes over
                        _state[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                    progress.step()
            finally:
                progress.close()
        return {t: _state.get(t, "not a compiled type") for t in type_names}
