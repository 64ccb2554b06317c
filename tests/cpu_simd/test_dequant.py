"""The cpu_simd dequantizers against the `gguf` package's reference decoders, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from forge_cpu_simd.dequant import api, dequantize, dequantize_rows, iter_row_chunks
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as reference

from forge.errors import GGUFFormatError, UnsupportedModelError, UsageError
from forge.gguf import SUPPORTED_TYPES, block_geometry, open_gguf
from tests.support.golden_rules import golden_model_files

# Byte offsets of the f16 scale fields in one block (as in shared/tools/gguf_twin.py): random
# bytes there could be inf/nan, so they are set to small finite values like real scales.
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}  # fmt: skip


def random_tensor(type_name: str, rows: int, blocks_per_row: int, seed: int = 0):
    """(raw uint8 [rows, row_bytes], row_len) of random blocks. For F32/F16/BF16 every bit pattern
    is fair (nan, inf and subnormals included); quant blocks get finite f16 scales."""
    rng = np.random.default_rng(seed)
    block, block_bytes = block_geometry(type_name)
    raw = rng.integers(0, 256, (rows, blocks_per_row, block_bytes), dtype=np.uint8)
    for off in F16_FIELDS.get(type_name, []):
        scale = rng.uniform(-2e-2, 2e-2, (rows, blocks_per_row)).astype(np.float16)
        raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(rows, blocks_per_row, 2)
    return raw.reshape(rows, -1), block * blocks_per_row


def assert_same_bits(got: np.ndarray, raw: np.ndarray, type_name: str) -> None:
    want = reference(raw, GGMLQuantizationType[type_name]).astype(np.float32, copy=False)
    assert got.dtype == np.float32 and got.shape == want.shape
    bad = got.view(np.uint32) != want.view(np.uint32)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        pytest.fail(f"{type_name}: {bad.sum()} weights differ, first at {i}: {got[i]} != {want[i]}")


def test_every_supported_type_has_a_decoder():
    assert set(api.DECODERS) == set(SUPPORTED_TYPES)


@pytest.mark.parametrize("type_name", SUPPORTED_TYPES)
@pytest.mark.parametrize("rows", [1, 7])
def test_random_blocks_match_reference(type_name, rows):
    raw, row_len = random_tensor(type_name, rows, 3 if block_geometry(type_name)[0] > 1 else 96)
    assert_same_bits(dequantize(raw, type_name, row_len), raw, type_name)


@pytest.mark.parametrize("type_name", SUPPORTED_TYPES)
def test_chunked_and_threaded_path_matches_reference(type_name, monkeypatch):
    # Tiny chunks that do not divide the rows, spread over the thread pool.
    monkeypatch.setattr(api, "CHUNK_WEIGHTS", 768)
    monkeypatch.setattr(api, "PARALLEL_MIN_WEIGHTS", 0)
    monkeypatch.setattr(api, "_threads", lambda: 2)
    raw, row_len = random_tensor(type_name, 13, 5 if block_geometry(type_name)[0] > 1 else 160, 1)
    out = np.full((13, row_len), np.nan, np.float32)
    assert dequantize(raw, type_name, row_len, out=out) is out
    assert_same_bits(out, raw, type_name)


def test_read_only_memmap_input(tmp_path):
    raw, row_len = random_tensor("Q4_K", 5, 2)
    path = tmp_path / "t.bin"
    raw.tofile(path)
    mapped = np.memmap(path, np.uint8, "r", shape=raw.shape)
    assert not mapped.flags.writeable
    assert_same_bits(dequantize(mapped, "Q4_K", row_len), raw, "Q4_K")


def test_non_contiguous_rows():
    raw, row_len = random_tensor("Q5_0", 9, 4)
    assert_same_bits(dequantize(raw[::2], "Q5_0", row_len), raw[::2], "Q5_0")


def test_mxfp4_every_scale_and_code():
    # 256 blocks, one per E8M0 exponent (subnormal, normal and overflowing scales), each holding
    # all 16 E2M1 codes in both nibbles
    codes = np.arange(16, dtype=np.uint8)
    qs = np.tile(codes | (codes[::-1] << 4), (256, 1))
    raw = np.concatenate([np.arange(256, dtype=np.uint8)[:, None], qs], axis=1)
    got = dequantize(raw, "MXFP4", 32)
    assert_same_bits(got, raw, "MXFP4")
    # exponent 127 is scale 1: codes 7 and 15 are E2M1's largest magnitude, +-6
    assert got[127, 7] == 6.0 and got[127, 15] == -6.0 and got[127, 16] == -6.0
    assert got[0, 1] == np.float32(2.0**-128)  # the smallest scale is a float32 subnormal


def test_row_slices_and_chunks_equal_the_whole():
    raw, row_len = random_tensor("Q6_K", 11, 2)
    whole = dequantize(raw, "Q6_K", row_len)
    np.testing.assert_array_equal(dequantize_rows(raw, "Q6_K", row_len, 3, 8), whole[3:8])
    assert dequantize_rows(raw, "Q6_K", row_len, 4, 4).shape == (0, row_len)
    starts, parts = zip(*iter_row_chunks(raw, "Q6_K", row_len, 4))
    assert starts == (0, 4, 8) and [len(p) for p in parts] == [4, 4, 3]
    np.testing.assert_array_equal(np.concatenate(parts), whole)


def golden_models(golden_dir):
    names = golden_model_files() + golden_model_files("moe.json")
    return [golden_dir / "models" / name for name in names]


def test_golden_models_match_reference(golden_dir):
    seen = set()
    models = golden_models(golden_dir)
    assert models, "no golden models found"
    for path in models:
        f = open_gguf(path)
        for info in f.tensors.values():
            raw = f.raw(info.name)
            got = dequantize(raw, info.type, info.shape[0])
            assert_same_bits(got, raw, info.type)
            seen.add(info.type)
        f.close()
    assert seen == set(SUPPORTED_TYPES)


def test_default_model_rows_match_reference(default_model_path):
    # The first rows of each tensor type, and the last rows of the 262144-row embedding.
    f = open_gguf(default_model_path)
    done = set()
    for info in f.tensors.values():
        if info.type in done and info.name != "token_embd.weight":
            continue
        raw = f.raw(info.name)
        for part in (raw[:48], raw[-48:]):
            assert_same_bits(dequantize(part, info.type, info.shape[0]), part, info.type)
        done.add(info.type)
    assert {"Q8_0", "Q5_0", "Q4_K", "Q6_K", "F32"} <= done


# -- error paths -------------------------------------------------------------------------------


@pytest.mark.parametrize("type_name", ["IQ2_XXS", "Q4_2", "nonsense"])
def test_unknown_type_is_unsupported(type_name):
    with pytest.raises(UnsupportedModelError, match=type_name):
        dequantize(np.zeros((1, 18), np.uint8), type_name, 32)


@pytest.mark.parametrize(
    "raw, row_len",
    [
        (np.zeros((2, 17), np.uint8), 32),  # Q4_0 rows of 32 weights are 18 bytes
        (np.zeros((2, 36), np.uint8), 32),  # two blocks' bytes for one block's weights
        (np.zeros((2, 18), np.uint8), 48),  # not a multiple of the block size
        (np.zeros((2, 18), np.uint8), 0),
        (np.zeros(18, np.uint8), 32),  # not 2-D
        (np.zeros((2, 18), np.int8), 32),  # not uint8
        (np.zeros((2, 18), np.float32), 32),
    ],
)
def test_bad_raw_shape_is_a_format_error(raw, row_len):
    with pytest.raises(GGUFFormatError):
        dequantize(raw, "Q4_0", row_len)


def test_not_an_array_is_a_format_error():
    with pytest.raises(GGUFFormatError):
        dequantize(bytes(18), "Q4_0", 32)


@pytest.mark.parametrize(
    "out",
    [
        np.zeros((2, 64), np.float32),
        np.zeros((2, 32), np.float64),
        np.zeros((2, 64), np.float32)[:, ::2],
        np.zeros((2, 32), np.float32).T.copy().T,
    ],
)
def test_bad_out_is_a_usage_error(out):
    with pytest.raises(UsageError):
        dequantize(np.zeros((2, 18), np.uint8), "Q4_0", 32, out=out)


def test_read_only_out_is_a_usage_error():
    out = np.zeros((2, 32), np.float32)
    out.flags.writeable = False
    with pytest.raises(UsageError):
        dequantize(np.zeros((2, 18), np.uint8), "Q4_0", 32, out=out)


@pytest.mark.parametrize("start, stop", [(-1, 2), (2, 1), (0, 4)])
def test_bad_row_span_is_a_usage_error(start, stop):
    with pytest.raises(UsageError):
        dequantize_rows(np.zeros((3, 18), np.uint8), "Q4_0", 32, start, stop)


def test_bad_chunk_rows_is_a_usage_error():
    with pytest.raises(UsageError):
        next(iter_row_chunks(np.zeros((3, 18), np.uint8), "Q4_0", 32, 0))
