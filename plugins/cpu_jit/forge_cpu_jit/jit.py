"""Compiling the kernels: numba's on-disk cache in the user's cache directory, the progress line
of a first compile, and the one-time message when the compiled kernels cannot be used.

Importing this module imports numba and the kernel modules (their functions compile lazily, on
first use). `compile_types(types)` compiles, or loads from the cache, what the listed weight types
need, by running each function once on tiny inputs of the exact argument types the products use.
"""

from __future__ import annotations

import functools
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
    fallback = (
        Path(tempfile.gettempdir())
        / f"forge-cpu_jit-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    )
    log.warning("forge cpu_jit: cannot write the kernel cache %s; using %s", root, fallback)
    return fallback


CACHE_DIR = _choose_cache_dir()


@functools.lru_cache(maxsize=1)
def _sources_digest() -> str:
    """A digest of every source file of this package: numba checks only the file of the function
    it caches, while the kernels inline code from the other modules (and a new numba or llvmlite
    must not reuse old code either). The package's path is part of it: numba's index checks each
    source file's time stamp, so two installations sharing one directory would each invalidate
    the other's kernels and recompile them on every alternation."""
    import llvmlite
    import numba

    h = hashlib.sha256(f"{numba.__version__} {llvmlite.__version__} {PACKAGE_DIR}".encode())
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:20]


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
            self._cache_path = str(CACHE_DIR / _sources_digest())

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
from numba import cfunc, types  # noqa: E402

from forge_cpu_jit import gemm, pool  # noqa: E402
from forge_cpu_jit.pool import get_pool  # noqa: E402

# The activation rounding each weight type's products use (llama.cpp's vec_dot partner type).
ACT_KIND = {
    "F32": "f32", "F16": "f16", "BF16": "bf16",
    "Q4_0": "q8_0", "Q4_1": "q8_0", "Q5_0": "q8_0", "Q5_1": "q8_0", "Q8_0": "q8_0",
    "MXFP4": "q8_0", "Q2_K": "q8_k", "Q3_K": "q8_k", "Q4_K": "q8_k", "Q5_K": "q8_k", "Q6_K": "q8_k",
}  # fmt: skip
FLOAT_MODE = {"f32": 0, "f16": 1, "bf16": 2}
BLOCK = {"F32": 1, "F16": 1, "BF16": 1, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32,
         "Q8_0": 32, "MXFP4": 32,
         "Q2_K": 256, "Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}  # fmt: skip
ROW_BYTES_PER_BLOCK = {"F32": 4, "F16": 2, "BF16": 2, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22,
                       "Q5_1": 24, "Q8_0": 34, "MXFP4": 17, "Q2_K": 84, "Q3_K": 110, "Q4_K": 144,
                       "Q5_K": 176, "Q6_K": 210}  # fmt: skip
TYPES = tuple(ACT_KIND)


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


_ENTRY_SIG = types.void(types.CPointer(types.int64), types.int64, types.int64)
_entries: dict[str, int] = {}  # name -> address of the compiled entry
_TILE = gemm.TILE
PARALLEL_MIN_MACS = 1 << 16  # smaller products run on the calling thread alone


def compiled_entry(key: str, py_fn) -> int:  # noqa: ANN001
    """The address of `py_fn`, an entry void(int64* args, int64 lo, int64 hi), compiled as a C
    callback (or loaded from the cache) once per process."""
    addr = _entries.get(key)
    if addr is None:
        fn = cfunc(_ENTRY_SIG, nopython=True, cache=True)(py_fn)
        addr = _entries[key] = fn.address
        _keep.append(fn)
    return addr


def _entry(name: str) -> int:
    """The address of a compiled entry: a weight type's (generated.py, by `gemm.ENTRIES`) or
    gemm.py's `entry_<name>`."""
    return compiled_entry(name, gemm.ENTRIES.get(name.upper()) or getattr(gemm, "entry_" + name))


_keep: list = []  # the compiled entries stay alive as long as the process


def address(a: np.ndarray) -> int:
    """The address of an array's first element (what the compiled entries' int64 args hold)."""
    return a.__array_interface__["data"][0]


class Activations:
    """One thread's activation buffers for one (rows, K, kind), reused call after call, with
    the argument arrays of its quantizer and of each weight it multiplies (only the
    addresses of x and of the output change from call to call)."""

    def __init__(self, rows: int, k: int, kind: str, bufs: tuple[np.ndarray, ...] | None = None):
        self.rows, self.k, self.kind = rows, k, kind
        self.bufs = b = bufs if bufs is not None else act_buffers(rows, k, kind)
        if kind in FLOAT_MODE:
            self.qargs = np.array([0, rows, k, address(b[0]), b[0].shape[1], FLOAT_MODE[kind]],
                                  np.int64)  # fmt: skip
            self.qentry = _entry("act_round")
        else:
            self.qargs = np.array([0, rows, k, address(b[0]), b[0].shape[1], address(b[1]),
                                   address(b[2]), address(b[3])], np.int64)  # fmt: skip
            self.qentry = _entry("act_" + kind)
        self._qaddr = self.qargs.ctypes.data
        self._weights: dict[int, tuple[np.ndarray, int, int, int]] = {}
        self._groups: dict[tuple[int, ...], tuple] = {}  # products() jobs, by their weights

    def quantize(self, x: np.ndarray) -> None:
        """Round x (float32 [rows, K], C-contiguous) into the buffers."""
        self.qargs[0] = address(x)
        if self.rows >= 8:
            p = get_pool()
            p.run(self.qentry, self.qargs, self.rows, max(1, self.rows // (2 * p.threads)))
        else:
            pool.run_inline(self.qentry, self._qaddr, self.rows)

    def _args(self, type_name: str, raw: np.ndarray) -> tuple[np.ndarray, int, int, int]:
        key = id(raw)
        found = self._weights.get(key)
        if found is not None and found[3] is raw:
            return found
        b, rows = self.bufs, raw.shape[0]
        if ACT_KIND[type_name] in FLOAT_MODE:
            args = np.array([address(raw), rows, raw.shape[1], FLOAT_MODE[ACT_KIND[type_name]],
                             address(b[0]), self.rows, b[0].shape[1], 0, 0, 0],
                            np.int64)  # fmt: skip
            entry, out_at = _entry("float"), 7
        else:
            args = np.array([address(raw), rows, raw.shape[1], address(b[0]), self.rows,
                             b[0].shape[1], address(b[1]), address(b[2]), address(b[3]), 0, 0, 0],
                            np.int64)  # fmt: skip
            entry, out_at = _entry(type_name.lower()), 9
        found = self._weights[key] = (args, entry, out_at, raw)
        return found

    def products(self, parts: list[tuple[str, np.ndarray, int]], out: np.ndarray) -> None:
        """Several products by these activations as one job on the threads: part (type, raw,
        col0) into out[:, col0 : col0 + its rows]."""
        if len(parts) == 1:
            self.product(*parts[0][:2], out, parts[0][2])
            return
        key = tuple(id(raw) for _, raw, _ in parts)
        found = self._groups.get(key)
        if found is None or any(a is not b for a, b in zip(found[2], (r for _, r, _ in parts))):
            fields, each, row = [len(parts)], [], 0
            for type_name, raw, col0 in parts:
                args, entry, at, _ = self._args(type_name, raw)
                fields += [entry, args.ctypes.data, row]
                each.append((args, at, col0))
                row += raw.shape[0]
            packed = np.array(fields + [row], np.int64)
            found = self._groups[key] = (packed, each, [r for _, r, _ in parts], row)
        packed, each, _, rows = found
        oaddr, ocols = address(out), out.shape[1]
        for args, at, col0 in each:
            args[at], args[at + 1], args[at + 2] = oaddr, ocols, col0
        self._run(_entry("group"), packed, rows)

    def product(self, type_name: str, raw: np.ndarray, out: np.ndarray, col0: int) -> None:
        """Every weight row of `raw` by these activations into out[:, col0 : col0 + rows],
        the rows shared by the threads."""
        args, entry, at, _ = self._args(type_name, raw)
        args[at], args[at + 1], args[at + 2] = address(out), out.shape[1], col0
        self._run(entry, args, raw.shape[0])

    def _run(self, entry: int, args: np.ndarray, rows: int) -> None:
        """entry(args, lo, hi) over weight rows 0..rows, shared by the threads if large."""
        p = get_pool()
        if self.rows * rows * self.k < PARALLEL_MIN_MACS or p.threads == 1:
            pool.run_inline(entry, args.ctypes.data, rows)
            return
        # about 4 chunks per thread (balance), whole tiles, at least 2 tiles each
        step = max(2 * _TILE, -(-rows // (4 * p.threads)) // _TILE * _TILE)
        p.run(entry, args, rows, step)


_local = threading.local()


def activations(rows: int, k: int, kind: str) -> Activations:
    """This thread's buffers for (rows, K, kind) (a few shapes are kept: decode, batches,
    prefill chunks)."""
    cache = getattr(_local, "acts", None)
    if cache is None:
        cache = _local.acts = {}
    key = (rows, k, kind)
    found = cache.get(key)
    if found is None:
        if len(cache) >= 32:
            cache.clear()
        found = cache[key] = Activations(rows, k, kind)
    return found


def quantize_rows(kind: str, x: np.ndarray, bufs: tuple[np.ndarray, ...]) -> None:
    """Round x into the given buffers (`act_buffers`; for tests and tools)."""
    Activations(x.shape[0], x.shape[1], kind, bufs).quantize(np.ascontiguousarray(x, np.float32))


def product(type_name: str, raw: np.ndarray, bufs: tuple[np.ndarray, ...], out: np.ndarray,
            col0: int, k: int | None = None) -> None:  # fmt: skip
    """Every weight row of `raw` by the activations in the given buffers (tests and tools)."""
    rows = bufs[0].shape[0]
    Activations(rows, k or bufs[0].shape[1], ACT_KIND[type_name], bufs).product(
        type_name, raw, out, col0
    )


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
    _entry("act_" + kind if kind.startswith("q8") else "act_round")
    _entry("float" if kind in FLOAT_MODE else type_name.lower())
    _entry("group")  # fused weights run as one job
    for rows in (1, 2):  # one activation row (decode) and several (prefill, batches)
        x = np.zeros((rows, k), np.float32)
        bufs = act_buffers(rows, k, kind)
        quantize_rows(kind, x, bufs)
        product(type_name, raw, bufs, np.zeros((rows, 4), np.float32), 0)


class _Progress:
    """A status line on stderr, shown only if compiling takes longer than PROGRESS_AFTER_S."""

    def __init__(self, names: list[str]):
        self.names, self.done, self.shown, self.t0 = names, 0, False, time.perf_counter()
        self._timer = threading.Timer(PROGRESS_AFTER_S, self._show)
        self._timer.daemon = True
        self._timer.start()

    def _line(self) -> str:
        return (
            f"forge cpu_jit: compiling the CPU kernels for {', '.join(self.names)} "
            f"[{self.done}/{len(self.names)}] (first run only; cached in {CACHE_DIR})"
        )

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


def compile_types(type_names, also=()) -> dict[str, bool | str]:  # noqa: ANN001
    """Make the kernels of these weight types ready; returns {type: True or error text}.
    `also`: callables that compile other kernels, run once under the same progress line when
    types are compiled (they report their own failures)."""
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
                for warm in also:
                    warm()
            finally:
                progress.close()
        return {t: _state.get(t, "not a compiled type") for t in type_names}
