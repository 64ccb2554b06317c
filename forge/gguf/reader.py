"""A validating, memory-mapped GGUF reader.

The `gguf` package supplies the format's constants and type table; parsing is done here because
`gguf.GGUFReader` builds a Python object per array element and needs ~10 s for the default model's
262,144-token vocabulary. Every read is bounds-checked against the file, so a truncated or hostile
file raises `GGUFFormatError` naming the problem instead of allocating or reading out of range.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFValueType

from forge.errors import GGUFFormatError, UnsupportedModelError
from forge.gguf.types import SUPPORTED_TYPES, block_geometry, type_name

MAGIC = b"GGUF"
MAX_DIMS = 4
MAX_COUNT = 1 << 24  # tensors or keys in one file; real files have a few thousand
MAX_NESTING = 8  # depth of arrays of arrays; real files use at most 2
DEFAULT_ALIGNMENT = 32

_SCALARS = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2", GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.BOOL: "<u1", GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8",
}  # fmt: skip


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file. `shape` is in GGML order: shape[0] is the contiguous dimension."""

    name: str
    type: str  # GGML type name, e.g. "Q4_K"
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def rows(self) -> int:
        """Number of rows (all dimensions but the first)."""
        return self.n_elements // self.shape[0]


class GGUFFile:
    """A parsed GGUF file: metadata, tensor table and memory-mapped tensor data.

    `metadata` maps keys to Python values: str, int, float, bool; arrays of strings become
    `list[str]`, numeric arrays become numpy arrays.
    """

    def __init__(self, path: str | os.PathLike, *, validate_types: bool = True):
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            raise GGUFFormatError(f"{self.path}: is a directory, not a GGUF file")
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer; the type check follows
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_BINARY", 0))
            with open(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise GGUFFormatError(
                        f"{self.path}: not a regular file ({_file_kind(st.st_mode)}), "
                        "not a GGUF file"
                    )
                size = st.st_size
                if size == 0:
                    raise GGUFFormatError(f"{self.path}: file is empty, not a GGUF file")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise GGUFFormatError(f"{self.path}: cannot read file: {e.strerror or e}") from e
        self.size = size
        self._buf = memoryview(self._map)
        self._pos = 0
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        try:
            self._parse(validate_types)
        except BaseException:
            self.close()
            raise

    # -- low-level reads ---------------------------------------------------------------------
    def _need(self, n: int, what: str) -> None:
        if n < 0 or self._pos + n > self.size:
            raise GGUFFormatError(
                f"{self.path}: truncated: {what} needs {n} bytes at offset {self._pos}, "
                f"file has {self.size}"
            )

    def _unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self._need(n, what)
        value = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += n
        return value[0] if len(value) == 1 else value

    def _string(self, what: str) -> str:
        n = self._unpack("<Q", f"length of {what}")
        self._need(n, what)
        raw = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")

    def _value(self, vtype: int, key: str) -> Any:
        try:
            vt = GGUFValueType(vtype)
        except ValueError:
            raise GGUFFormatError(
                f"{self.path}: key {key!r} has unknown value type {vtype}"
            ) from None
        if vt == GGUFValueType.STRING:
            return self._string(f"string value of {key!r}")
        if vt == GGUFValueType.ARRAY:
            sub = self._unpack("<I", f"array type of {key!r}")
            count = self._unpack("<Q", f"array length of {key!r}")
            return self._array(sub, count, key, 1)
        dtype = np.dtype(_SCALARS[vt])
        self._need(dtype.itemsize, f"value of {key!r}")
        value = np.frombuffer(self._buf, dtype, 1, self._pos)[0].item()
        self._pos += dtype.itemsize
        return bool(value) if vt == GGUFValueType.BOOL else value

    def _array(self, sub: int, count: int, key: str, depth: int) -> Any:
        if sub == GGUFValueType.STRING:
            if count > (self.size - self._pos) // 8:
                raise GGUFFormatError(
                    f"{self.path}: key {key!r}: array of {count} strings cannot fit in the file"
                )
            return [self._string(f"element of {key!r}") for _ in range(count)]
        if sub == GGUFValueType.ARRAY:
            if depth >= MAX_NESTING:
                raise GGUFFormatError(
                    f"{self.path}: key {key!r}: arrays nested deeper than {MAX_NESTING} levels"
                )
            if count > (self.size - self._pos) // 12:
                raise GGUFFormatError(
                    f"{self.path}: key {key!r}: nested array count {count} too large"
                )
            return [
                self._array(
                    self._unpack("<I", f"array type of {key!r}"),
                    self._unpack("<Q", f"array length of {key!r}"),
                    key,
                    depth + 1,
                )
                for _ in range(count)
            ]
        try:
            dtype = np.dtype(_SCALARS[GGUFValueType(sub)])
        except (ValueError, KeyError):
            raise GGUFFormatError(
                f"{self.path}: key {key!r}: unknown array element type {sub}"
            ) from None
        if count > (self.size - self._pos) // dtype.itemsize:
            raise GGUFFormatError(
                f"{self.path}: key {key!r}: array of {count} elements runs past the end of the file"
            )
        arr = np.frombuffer(self._buf, dtype, count, self._pos).copy()
        self._pos += count * dtype.itemsize
        return arr.astype(bool) if sub == GGUFValueType.BOOL else arr

    # -- structure -----------------------------------------------------------------------------
    def _parse(self, validate_types: bool) -> None:
        self._need(4, "magic")
        magic = bytes(self._buf[0:4])
        if magic != MAGIC:
            raise GGUFFormatError(f"{self.path}: bad magic {magic!r}: not a GGUF file")
        self._pos = 4
        version = self._unpack("<I", "version")
        if version not in (2, 3):
            hint = ""
            if version & 0xFFFF == 0 and (version >> 24) in (2, 3):
                hint = "; the file is big-endian, which forge does not read"
            raise GGUFFormatError(
                f"{self.path}: unsupported GGUF version {version} (expected 2 or 3){hint}"
            )
        self.version = version
        n_tensors = self._unpack("<Q", "tensor count")
        n_kv = self._unpack("<Q", "metadata count")
        for count, what in ((n_tensors, "tensor count"), (n_kv, "metadata count")):
            if count > MAX_COUNT or count > self.size:
                raise GGUFFormatError(f"{self.path}: absurd {what} {count}")
        for i in range(n_kv):
            key = self._string(f"key #{i}")
            vtype = self._unpack("<I", f"type of key {key!r}")
            if key in self.metadata:
                raise GGUFFormatError(f"{self.path}: duplicate metadata key {key!r}")
            self.metadata[key] = self._value(vtype, key)
        infos = []
        names: set[str] = set()
        for i in range(n_tensors):
            info = self._tensor_info(i, validate_types)
            if info[0] in names:
                raise GGUFFormatError(f"{self.path}: duplicate tensor name {info[0]!r}")
            names.add(info[0])
            infos.append(info)
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if (
            not isinstance(alignment, int)
            or isinstance(alignment, bool)
            or alignment <= 0
            or alignment & (alignment - 1)
        ):
            raise GGUFFormatError(
                f"{self.path}: general.alignment {alignment!r} is not a power of 2"
            )
        self.alignment = alignment
        self.data_offset = -(-self._pos // alignment) * alignment
        for name, ttype, shape, rel in infos:
            self._add_tensor(name, ttype, shape, rel)

    def _tensor_info(self, i: int, validate_types: bool) -> tuple[str, str, tuple[int, ...], int]:
        name = self._string(f"name of tensor #{i}")
        n_dims = self._unpack("<I", f"dimension count of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFFormatError(
                f"{self.path}: tensor {name!r} has {n_dims} dimensions (1..4 allowed)"
            )
        shape = tuple(
            self._unpack(f"<{n_dims}Q", f"shape of tensor {name!r}")
            if n_dims > 1
            else (self._unpack("<Q", f"shape of tensor {name!r}"),)
        )
        type_id = self._unpack("<I", f"type of tensor {name!r}")
        rel = self._unpack("<Q", f"offset of tensor {name!r}")
        ttype = type_name(type_id)
        if ttype is None:
            raise GGUFFormatError(f"{self.path}: tensor {name!r} has unknown type id {type_id}")
        if validate_types and ttype not in SUPPORTED_TYPES:
            raise UnsupportedModelError(
                f"{self.path}: tensor {name!r} uses weight type {ttype}, which forge does not "
                f"support (supported: {', '.join(SUPPORTED_TYPES)})"
            )
        if any(d == 0 for d in shape):
            raise GGUFFormatError(
                f"{self.path}: tensor {name!r} has a zero dimension (shape {list(shape)})"
            )
        return name, ttype, shape, rel

    def _add_tensor(self, name: str, ttype: str, shape: tuple[int, ...], rel: int) -> None:
        block, bsize = block_geometry(ttype)
        if shape[0] % block:
            raise GGUFFormatError(
                f"{self.path}: tensor {name!r} of type {ttype} has row length {shape[0]}, "
                f"not a multiple of its block size {block}"
            )
        n = 1
        for d in shape:
            n *= d
        nbytes = n // block * bsize
        start = self.data_offset + rel
        if rel % self.alignment:
            raise GGUFFormatError(
                f"{self.path}: data of tensor {name!r}: offset {rel} is not a multiple of the "
                f"alignment {self.alignment}"
            )
        if start + nbytes > self.size:
            raise GGUFFormatError(
                f"{self.path}: data of tensor {name!r} ({nbytes} bytes at offset {start}) lies "
                f"outside the file ({self.size} bytes)"
            )
        self.tensors[name] = TensorInfo(name, ttype, shape, start, nbytes)

    # -- access --------------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFFormatError(f"{self.path}: metadata has no general.architecture")
        return arch

    def raw(self, name: str) -> np.ndarray:
        """A tensor's bytes as a read-only uint8 array of shape [rows, row_bytes] (no copy)."""
        info = self.tensors[name]
        flat = np.frombuffer(self._buf, np.uint8, info.nbytes, info.offset)
        return flat.reshape(info.rows, info.nbytes // info.rows)

    def close(self) -> None:
        """Release the mapping now if no array from `raw` is alive (else when the last one dies)."""
        try:
            self._buf.release()
            self._map.close()
        except BufferError:
            pass


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return kind
    return "not a plain file"


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open and validate a GGUF file. Raises `GGUFFormatError` or `UnsupportedModelError`."""
    if not os.path.exists(path):
        raise GGUFFormatError(f"{os.fspath(path)}: no such file")
    return GGUFFile(path)
