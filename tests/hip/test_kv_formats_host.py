"""hip's KV cache formats without a GPU: kernels/kv_format.h's reads (compiled as host C++) of rows
built from the gguf package's quantizers (tests/support/kv_rows.py), the row sizes Python and the
kernels agree on, what the memory preflight counts, which formats and head sizes are refused, and
what the attention launches are told (the format id; tensor cores for float16, Q8_0 and Q4_0
caches). The stores and the attention arithmetic run on the device (tests/gpu/test_attention.py,
test_attn_prefill.py)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from forge_hip.capacity import kv_format, memory_needed
from forge_hip.contract import constants
from forge_hip.kv import KV_FORMAT_IDS, row_bytes

from forge.backend import SeqBatch
from forge.errors import UnsupportedModelError
from forge.gguf import open_gguf
from forge.kv_cache import KvFormat, KvTypes
from forge.models import build_spec
from forge.plugins import get_plugin_manager
from tests.support.fake_runtime import FakeRuntime
from tests.support.host_cxx import build_host_library
from tests.support.kv_rows import pack, unpack

HARNESS = """
#define FORGE_HOST 1
#include "kv_format.h"
#define READ(F) \\
    extern "C" void read_##F(const void* rows, int n_rows, int n, float* out) { \\
        for (int r = 0; r < n_rows; ++r) \\
            for (int d = 0; d < n; ++d) \\
                out[(long long)r * n + d] = kv_elem<KV_##F>(rows, r, n, d); }
READ(F32) READ(F16) READ(BF16) READ(Q8_0) READ(Q4_0)
extern "C" int row_bytes(int fmt, int n) { return kv_row_bytes(fmt, n); }
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return build_host_library(tmp_path_factory.mktemp("kv"), HARNESS)


@pytest.mark.parametrize("n", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("fmt", list(KvFormat), ids=lambda f: f.value)
def test_kernels_read_the_rows_gguf_quantized(lib, fmt, n):
    rng = np.random.default_rng()
    rows = 7
    x = (rng.standard_normal((rows, n)) * rng.uniform(0.01, 10, (rows, 1))).astype(np.float32)
    raw = np.ascontiguousarray(pack(fmt, x))
    assert raw.shape == (rows, row_bytes(fmt, n)) == (rows, lib.row_bytes(KV_FORMAT_IDS[fmt], n))
    out = np.full((rows, n), np.nan, np.float32)
    getattr(lib, f"read_{fmt.name}")(ctypes.c_void_p(raw.ctypes.data), rows, n,
                                     ctypes.c_void_p(out.ctypes.data))  # fmt: skip
    np.testing.assert_array_equal(out, unpack(fmt, raw, n))
    step = {
        KvFormat.Q8_0: 1 / 127,
        KvFormat.Q4_0: 1 / 7,
        KvFormat.BF16: 2**-8,
        KvFormat.F16: 2**-11,
    }
    amax = np.abs(x).max(axis=1, keepdims=True)
    assert (np.abs(out - x) <= step.get(fmt, 0) * amax).all()  # it is x, in that format


def test_row_sizes():
    assert [row_bytes(f, 128) for f in KvFormat] == [512, 256, 256, 136, 72]
    # 53% of float16 for Q8_0 at head size 128 (issue target: <= 55%); rows padded to 8 bytes
    # (Q8_0) and 4 (Q4_0)
    assert row_bytes(KvFormat.Q8_0, 32) == 40 and row_bytes(KvFormat.Q8_0, 64) == 72
    assert row_bytes(KvFormat.Q4_0, 96) == 56


def _model(golden_dir, name):
    gguf = open_gguf(str(golden_dir / "models" / name))
    return gguf, build_spec(gguf)


@pytest.mark.parametrize("fmt", list(KvFormat), ids=lambda f: f.value)
def test_preflight_counts_the_chosen_format(golden_dir, fmt):
    gguf, spec = _model(golden_dir, "qwen3-q8_0.gguf")
    need = memory_needed(spec, gguf, 1024, KvTypes(fmt, fmt))["kv_cache"]
    per_head = row_bytes(fmt, spec.head_dim) + row_bytes(fmt, spec.head_dim_v)
    assert need >= spec.n_layer * 1024 * spec.n_head_kv * per_head
    assert need < spec.n_layer * (1024 * spec.n_head_kv * per_head + 2 * 256)  # alignment only


def test_formats_refused_by_name(golden_dir):
    gguf, spec = _model(golden_dir, "qwen3-q8_0.gguf")
    assert kv_format(spec, gguf, KvTypes(KvFormat.Q4_0, None)) is KvFormat.Q4_0  # V follows K
    with pytest.raises(UnsupportedModelError, match="one format; asked for q8_0 and f16"):
        kv_format(spec, gguf, KvTypes(KvFormat.Q8_0, KvFormat.F16))
    odd = spec.model_copy(update={"head_dim": spec.head_dim + 8})
    with pytest.raises(UnsupportedModelError, match=r"q8_0 KV cache needs head sizes that are "
                       r"multiples of 32; this model's are"):  # fmt: skip
        kv_format(odd, gguf, KvTypes(KvFormat.Q8_0, KvFormat.Q8_0))
    assert kv_format(odd, gguf, KvTypes(KvFormat.BF16, KvFormat.BF16)) is KvFormat.BF16


@pytest.mark.usefixtures("attn_decode_path")
@pytest.mark.parametrize("fmt", [KvFormat.F16, KvFormat.Q8_0, KvFormat.Q4_0, KvFormat.BF16],
                         ids=lambda f: f.value)  # fmt: skip
def test_launches_carry_the_format(golden_dir, fmt):
    """Every attention launch gets the cache's format id; a long prompt's attn_prefill takes
    tensor cores (AP_TENSOR_CORES) with float16, Q8_0 and Q4_0 caches, not bfloat16."""
    from forge_hip.runner import HipRunner

    gguf, spec = _model(golden_dir, "qwen3-q8_0.gguf")
    rt = FakeRuntime()
    runner = HipRunner(spec, gguf, get_plugin_manager().kernels, runtime=rt,
                       kv_types=KvTypes(fmt, fmt))  # fmt: skip
    runner.allocate_kv(64, 16)
    assert runner.kv.nbytes == memory_needed(spec, gguf, 64 * 16, KvTypes(fmt, fmt))["kv_cache"]
    fid = KV_FORMAT_IDS[fmt]
    runner.forward([SeqBatch(np.arange(1, 301, dtype=np.int32) % 400, 0, np.arange(19), "last")])
    runner.forward([SeqBatch(np.array([5], np.int32), 300, np.arange(20), "last")])
    launches = {n: a for n, a in rt.launch_args}  # the last of each name
    assert launches["qk_rope_store"][-1] == fid
    assert [n for n, _ in rt.launch_args if n.startswith("attn_decode")]
    decode = next(a for n, a in reversed(rt.launch_args) if n.startswith("attn_decode"))
    name, prefill = next((n, a) for n, a in rt.launch_args if n.startswith("attn_prefill"))
    assert name == ("attn_prefill_q64" if fmt.block > 1 else "attn_prefill_64")
    assert decode[28] == fid  # (attn_decode's kv_fmt; the grouped kernels take H last)
    tc = constants()["AP_TENSOR_CORES"] if fmt is not KvFormat.BF16 else 0
    assert prefill[15] == fid | tc  # kv_mode
