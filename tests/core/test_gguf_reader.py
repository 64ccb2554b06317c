"""forge.gguf.reader: values and tensors round-trip against the `gguf` package, and every kind of
malformed file raises a typed error that names the problem.

Valid files are written with gguf.GGUFWriter and read back with gguf.GGUFReader as the independent
reference. Malformed files are assembled byte by byte (`raw_gguf`) so that each one breaks exactly
one thing.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from forge.errors import GGUFFormatError, UnsupportedModelError
from forge.gguf import SUPPORTED_TYPES, open_gguf
from tests.support.gguf_factory import quantized, tiny_model, write_gguf

SCALARS = [
    ("u8", 250, V.UINT8), ("i8", -100, V.INT8), ("u16", 65000, V.UINT16), ("i16", -32000, V.INT16),
    ("u32", 4_000_000_000, V.UINT32), ("i32", -2_000_000_000, V.INT32), ("f32", 0.15625, V.FLOAT32),
    ("b_true", True, V.BOOL), ("b_false", False, V.BOOL), ("u64", 2**64 - 1, V.UINT64),
    ("i64", -(2**62), V.INT64), ("f64", 1e-300, V.FLOAT64), ("s", "héllo ✓", V.STRING),
    ("s_empty", "", V.STRING),
]  # fmt: skip
ARRAYS = [
    ("a_u8", [0, 255], V.UINT8), ("a_i8", [-128, 127], V.INT8), ("a_u16", [1, 65535], V.UINT16),
    ("a_i16", [-3, 3], V.INT16), ("a_u32", [7, 2**32 - 1], V.UINT32), ("a_i32", [-7, 9], V.INT32),
    ("a_f32", [0.5, -2.25], V.FLOAT32), ("a_bool", [True, False, True], V.BOOL),
    ("a_u64", [2**63], V.UINT64), ("a_i64", [-(2**63)], V.INT64),
    ("a_f64", [1.5, 1e200], V.FLOAT64),
    ("a_str", ["a", "", "✓✓", "<0x0A>"], V.STRING),
]  # fmt: skip


@pytest.fixture(scope="module")
def every_type(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "types.gguf"
    kvs = [(k, v, t, None) for k, v, t in SCALARS]
    kvs += [(k, v, V.ARRAY, t) for k, v, t in ARRAYS]
    kvs.append(("nested", [[1, 2], [3]], V.ARRAY, V.ARRAY))
    tensors = [
        ("f32", np.arange(24, dtype=np.float32).reshape(2, 3, 4), None),
        ("f16", np.linspace(-1, 1, 64, dtype=np.float16).reshape(2, 32), None),
        ("q8", quantized(3, 64, Q.Q8_0), Q.Q8_0),
        ("q4k", quantized(2, 256, Q.Q4_K, seed=5), Q.Q4_K),
        ("vec", np.ones(7, np.float32), None),
    ]
    return write_gguf(path, kvs, tensors)


def test_metadata_of_every_type_round_trips(every_type):
    ours = open_gguf(every_type).metadata
    ref = gguf.GGUFReader(str(every_type)).fields
    assert ours["general.architecture"] == "test"
    for key, value, vtype in SCALARS:
        assert ref[key].types == [vtype]
        assert ours[key] == ref[key].contents() == value, key
        assert type(ours[key]) is type(value), key
    for key, value, vtype in ARRAYS:
        expected = ref[key].contents()
        if vtype == V.STRING:
            assert ours[key] == expected == value
            continue
        assert isinstance(ours[key], np.ndarray), key
        assert ours[key].dtype == (bool if vtype == V.BOOL else ref[key].parts[-1].dtype), key
        np.testing.assert_array_equal(ours[key], np.asarray(expected).reshape(-1), err_msg=key)
        np.testing.assert_array_equal(ours[key], np.asarray(value).reshape(-1), err_msg=key)
    nested = ours["nested"]
    assert [a.tolist() for a in nested] == [[1, 2], [3]]
    assert len(ours) == len([k for k in ref if not k.startswith("GGUF.")])


def test_tensor_infos_and_bytes_match_the_reference(every_type):
    ours = open_gguf(every_type)
    ref = gguf.GGUFReader(str(every_type))
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.type == Q(t.tensor_type).name
        assert info.shape == tuple(int(d) for d in t.shape)
        assert info.offset == t.data_offset
        assert info.nbytes == t.n_bytes
        assert info.offset % ours.alignment == 0
        raw = ours.raw(t.name)
        assert raw.dtype == np.uint8 and not raw.flags.writeable
        assert raw.shape == (info.rows, info.nbytes // info.rows)
        assert raw.tobytes() == np.asarray(t.data).tobytes()
    assert ours.tensors["f32"].shape == (4, 3, 2)  # GGML order: contiguous dimension first
    assert ours.tensors["f32"].rows == 6
    np.testing.assert_array_equal(
        ours.raw("f32").view(np.float32).reshape(2, 3, 4), np.arange(24).reshape(2, 3, 4)
    )


def test_default_model_opens(default_model_path):
    g = open_gguf(default_model_path)
    assert g.architecture == "gemma3"
    assert len(g.metadata["tokenizer.ggml.tokens"]) == 262144
    assert {t.type for t in g.tensors.values()} <= set(SUPPORTED_TYPES)
    assert max(t.offset + t.nbytes for t in g.tensors.values()) <= g.size


# -- malformed files -----------------------------------------------------------------------------
def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv_u32(key: str, value: int) -> bytes:
    return s(key) + struct.pack("<II", V.UINT32, value)


def kv_str(key: str, value: str) -> bytes:
    return s(key) + struct.pack("<I", V.STRING) + s(value)


def tinfo(name: str, dims: tuple[int, ...], ttype: int = Q.F32, offset: int = 0) -> bytes:
    return (
        s(name)
        + struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
        + struct.pack("<IQ", ttype, offset)
    )


def raw_gguf(
    kvs: list[bytes] = (),
    tinfos: list[bytes] = (),
    data: bytes = b"",
    *,
    n_kv: int | None = None,
    n_tensors: int | None = None,
    version: int = 3,
    magic: bytes = b"GGUF",
) -> bytes:
    """A GGUF file from pre-encoded parts; the data section starts at the next 32-byte boundary."""
    kvs = [kv_str("general.architecture", "test"), *kvs]
    head = magic + struct.pack(
        "<IQQ",
        version,
        len(tinfos) if n_tensors is None else n_tensors,
        len(kvs) if n_kv is None else n_kv,
    )
    body = head + b"".join(kvs) + b"".join(tinfos)
    return body + b"\0" * (-len(body) % 32) + data


VALID = raw_gguf(
    [kv_u32("x", 1)], [tinfo("t", (8, 2)), tinfo("u", (4,), offset=64)], bytes(range(80))
)


def test_raw_builder_matches_the_reference(tmp_path):
    path = tmp_path / "ok.gguf"
    path.write_bytes(VALID)
    g = open_gguf(path)
    ref = gguf.GGUFReader(str(path))
    assert (
        g.metadata
        == {"general.architecture": "test", "x": 1}
        == {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    )
    assert g.raw("t").tobytes() == bytes(range(64))
    assert g.raw("u").tobytes() == bytes(range(64, 80))
    assert g.tensors["u"].shape == (4,) and g.tensors["t"].shape == (8, 2)


def _cut(data: bytes, marker: bytes, extra: int = 0) -> bytes:
    return data[: data.index(marker) + extra]


HUGE = 2**63
MALFORMED = {
    "bad magic": (VALID.replace(b"GGUF", b"GGML", 1), r"bad magic b'GGML'.*not a GGUF file"),
    "version 1": (raw_gguf(version=1), r"unsupported GGUF version 1 \(expected 2 or 3\)"),
    "version 4": (raw_gguf(version=4), r"unsupported GGUF version 4"),
    "big endian": (raw_gguf(version=3 << 24), r"version 50331648.*big-endian"),
    "truncated header": (VALID[:10], r"truncated: version|truncated: tensor count"),
    "header only magic": (b"GGUF", r"truncated: version needs 4 bytes at offset 4"),
    "truncated metadata key": (_cut(VALID, b"x\x04\x00"), r"truncated: key #1 needs 1 bytes"),
    "truncated metadata value": (
        _cut(VALID, b"x\x04\x00", 7),
        r"truncated: value of 'x' needs 4 bytes",
    ),
    "truncated tensor info": (
        _cut(VALID, b"u\x01\x00", 8),
        r"truncated: shape of tensor 'u' needs 8 bytes",
    ),
    "truncated tensor data": (VALID[:-1], r"tensor 'u'.*16 bytes at offset \d+.*outside the file"),
    "data outside the file": (
        raw_gguf(tinfos=[tinfo("t", (8,), offset=2**40)], data=bytes(32)),
        r"tensor 't'.*outside the file",
    ),
    "offset overflowing": (
        raw_gguf(tinfos=[tinfo("t", (8,), offset=2**64 - 32)], data=bytes(32)),
        r"tensor 't'.*outside the file",
    ),
    "misaligned offset": (
        raw_gguf(tinfos=[tinfo("t", (4,), offset=4)], data=bytes(64)),
        r"tensor 't'.*offset 4 is not a multiple of the alignment 32",
    ),
    "unknown tensor type": (
        raw_gguf(tinfos=[tinfo("t", (4,), ttype=99)], data=bytes(32)),
        r"tensor 't' has unknown type id 99",
    ),
    "zero dimensions": (raw_gguf(tinfos=[tinfo("t", ())]), r"tensor 't' has 0 dimensions"),
    "five dimensions": (
        raw_gguf(tinfos=[tinfo("t", (1, 1, 1, 1, 1))]),
        r"tensor 't' has 5 dimensions \(1..4 allowed\)",
    ),
    "zero-sized dimension": (
        raw_gguf(tinfos=[tinfo("t", (4, 0))], data=bytes(32)),
        r"tensor 't' has a zero dimension",
    ),
    "absurd dimension": (
        raw_gguf(tinfos=[tinfo("t", (HUGE, HUGE, HUGE, HUGE))], data=bytes(32)),
        r"tensor 't'.*outside the file",
    ),
    "row not whole blocks": (
        raw_gguf(tinfos=[tinfo("t", (33,), ttype=Q.Q8_0)], data=bytes(64)),
        r"tensor 't' of type Q8_0 has row length 33, not a multiple of its block size 32",
    ),
    "duplicate tensor": (
        raw_gguf(tinfos=[tinfo("t", (4,)), tinfo("t", (4,), offset=32)], data=bytes(64)),
        r"duplicate tensor name 't'",
    ),
    "absurd tensor count": (raw_gguf(n_tensors=HUGE), rf"absurd tensor count {HUGE}"),
    "absurd metadata count": (raw_gguf(n_kv=2**40), r"absurd metadata count 1099511627776"),
    "absurd string length": (
        raw_gguf([struct.pack("<Q", HUGE) + b"key"]),
        rf"truncated: key #1 needs {HUGE} bytes",
    ),
    "absurd string value length": (
        raw_gguf([s("k") + struct.pack("<IQ", V.STRING, 2**40)]),
        r"truncated: string value of 'k' needs 1099511627776 bytes",
    ),
    "absurd array count": (
        raw_gguf([s("k") + struct.pack("<IIQ", V.ARRAY, V.UINT32, 2**40)]),
        r"key 'k': array of 1099511627776 elements runs past the end of the file",
    ),
    "absurd string array count": (
        raw_gguf([s("k") + struct.pack("<IIQ", V.ARRAY, V.STRING, HUGE)]),
        rf"key 'k': array of {HUGE} strings cannot fit in the file",
    ),
    "deeply nested array": (
        raw_gguf([s("k") + struct.pack("<I", V.ARRAY) + struct.pack("<IQ", V.ARRAY, 1) * 2000]),
        r"key 'k': arrays nested deeper than",
    ),
    "unknown value type": (raw_gguf([s("k") + struct.pack("<I", 77)]), r"'k' has unknown value"),
    "unknown array type": (
        raw_gguf([s("k") + struct.pack("<IIQ", V.ARRAY, 77, 1)]),
        r"key 'k': unknown array element type 77",
    ),
    "duplicate key": (raw_gguf([kv_u32("x", 1), kv_u32("x", 2)]), r"duplicate metadata key 'x'"),
    "bad alignment": (
        raw_gguf([kv_u32("general.alignment", 24)]),
        r"general.alignment 24 is not a power of 2",
    ),
    "zero alignment": (
        raw_gguf([kv_u32("general.alignment", 0)]),
        r"general.alignment 0 is not a power of 2",
    ),
    "empty file": (b"", r"file is empty"),
    "alignment of type bool": (
        raw_gguf([s("general.alignment") + struct.pack("<IB", V.BOOL, 1)]),
        r"general.alignment True is not a power of 2",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_file_raises_a_typed_error_naming_the_problem(tmp_path, case):
    data, pattern = MALFORMED[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFFormatError) as err:
        open_gguf(path)
    assert re.search(pattern, str(err.value)), str(err.value)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("ttype", [Q.IQ2_XXS, Q.IQ4_NL, Q.Q8_K, Q.TQ1_0, Q.I32])
def test_unsupported_weight_type(tmp_path, ttype):
    block, size = gguf.GGML_QUANT_SIZES[ttype]
    path = tmp_path / "iq.gguf"
    path.write_bytes(raw_gguf(tinfos=[tinfo("w", (block,), ttype=ttype)], data=bytes(size)))
    with pytest.raises(UnsupportedModelError, match=rf"'w' uses weight type {ttype.name}"):
        open_gguf(path)


def test_every_supported_type_opens(tmp_path):
    tensors = [(name, quantized(2, 256, Q[name], i), Q[name]) for i, name in
               enumerate(SUPPORTED_TYPES)]  # fmt: skip
    path = write_gguf(tmp_path / "all.gguf", [], tensors)
    g = open_gguf(path)
    for name in SUPPORTED_TYPES:
        assert g.tensors[name].type == name
        assert g.raw(name).tobytes() == tensors[SUPPORTED_TYPES.index(name)][1].tobytes()


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(GGUFFormatError, match=r"no such file"):
        open_gguf(tmp_path / "absent.gguf")
    with pytest.raises(GGUFFormatError, match=r"is a directory, not a GGUF file"):
        open_gguf(tmp_path)


def test_empty_arrays(tmp_path):
    # GGUFWriter refuses empty arrays, but files in the wild have them (e.g. no merges)
    empty_u32 = s("e") + struct.pack("<IIQ", V.ARRAY, V.UINT32, 0)
    empty_str = s("es") + struct.pack("<IIQ", V.ARRAY, V.STRING, 0)
    path = tmp_path / "empty.gguf"
    path.write_bytes(raw_gguf([empty_u32, empty_str]))
    md = open_gguf(path).metadata
    assert md["es"] == []
    assert md["e"].dtype == np.uint32 and md["e"].shape == (0,)


def test_missing_architecture(tmp_path):
    path = tmp_path / "noarch.gguf"
    path.write_bytes(VALID.replace(b"general.architecture", b"general.arch1tecture"))
    g = open_gguf(path)  # the reader itself does not need it; model building does
    with pytest.raises(GGUFFormatError, match=r"no general.architecture"):
        _ = g.architecture


def test_tiny_model_fixture_is_valid(tmp_path):
    for arch in ("llama", "qwen2"):
        g = open_gguf(tiny_model(tmp_path / f"{arch}.gguf", arch))
        assert g.architecture == arch
        ref = gguf.GGUFReader(str(g.path))
        assert sorted(g.tensors) == sorted(t.name for t in ref.tensors)


def test_close_releases_the_mapping(every_type):
    g = open_gguf(every_type)
    g.close()
    g.close()  # twice is fine
    h = open_gguf(every_type)
    raw = h.raw("q8")
    h.close()  # an array is still alive: the mapping stays usable for it
    assert raw.sum() >= 0
