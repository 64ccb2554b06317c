"""The platform-neutral parts of forge_hip's runtime, checked without a GPU."""

from __future__ import annotations

import ctypes
import re
from enum import IntEnum

import pytest
from forge_hip import rocm_libs
from forge_hip.library import KERNELS
from forge_hip.runtime import amd, nvidia, open_runtime
from forge_hip.runtime.base import ArgPack, DeviceBuffer, dims
from forge_hip.runtime.cache import cache_key, cached_compile
from forge_hip.sources import load_source, source_names

from forge.errors import BackendUnavailableError, ForgeRuntimeError, OutOfMemoryError, UsageError


def test_argpack_lays_out_each_value_at_its_pointer():
    pack = ArgPack("pifqu", [DeviceBuffer(0xDEADBEEF000, 16), -7, 0.5, 2**40, 3])
    ptrs = (ctypes.c_void_p * 5).from_address(pack.address)
    assert ctypes.c_uint64.from_address(ptrs[0]).value == 0xDEADBEEF000
    assert ctypes.c_int32.from_address(ptrs[1]).value == -7
    assert ctypes.c_float.from_address(ptrs[2]).value == 0.5
    assert ctypes.c_int64.from_address(ptrs[3]).value == 2**40
    assert ctypes.c_uint32.from_address(ptrs[4]).value == 3


def test_argpack_and_dims_reject_bad_input():
    with pytest.raises(UsageError, match="wants 2 arguments"):
        ArgPack("pi", [1])
    with pytest.raises(UsageError, match="unknown kernel argument type 'x'"):
        ArgPack("x", [1])
    assert dims([5]) == (5, 1, 1) and dims((2, 3)) == (2, 3, 1)
    with pytest.raises(UsageError):
        dims([0])
    with pytest.raises(UsageError):
        dims([1, 1, 1, 1])


def test_compile_cache_hits_and_keys(tmp_path):
    calls = []

    def compile_fn(tag=b"code"):
        calls.append(tag)
        return tag

    args = ("src", "sm_90", "nvrtc-13.0", ("-DX",))
    assert cached_compile(*args, compile_fn, directory=tmp_path) == b"code"
    assert cached_compile(*args, compile_fn, directory=tmp_path) == b"code"
    assert len(calls) == 1
    keys = {
        cache_key(*args),
        cache_key("src2", *args[1:]),
        cache_key("src", "gfx90a", *args[2:]),
        cache_key("src", "sm_90", "nvrtc-13.1", ("-DX",)),
        cache_key(*args[:3], ("-DY",)),
    }
    assert len(keys) == 5


def test_compile_cache_survives_an_unwritable_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert cached_compile("s", "a", "c", (), lambda: b"x", directory=blocker / "sub") == b"x"


def test_sources_inline_local_headers_once(tmp_path):
    (tmp_path / "a.h").write_text('#pragma once\n#include "b.h"\nint a;\n')
    (tmp_path / "b.h").write_text("#pragma once\nint b;\n")
    (tmp_path / "k.hip").write_text('#include "a.h"\n#include "b.h"\n#include <sys.h>\nint k;\n')
    text = load_source("k.hip", str(tmp_path))
    assert text.count("int b;") == 1 and "int a;" in text and "#include <sys.h>" in text
    assert "pragma once" not in text and '#include "' not in text
    (tmp_path / "bad.hip").write_text('#include "missing.h"\n')
    with pytest.raises(ForgeRuntimeError, match="missing.h"):
        load_source("bad.hip", str(tmp_path))


def _pasted(name: str, text: str) -> bool:
    """Whether a macro of `text` pastes `name`: a prefix of it before "##" in a definition
    ("moe_glu_##SUFFIX(") and the rest as the first argument of an invocation
    ("MOE_KERNELS(r1_mxfp4, ...")."""
    return any(f"{name[:i]}##" in text
               and re.search(rf"\b[A-Z][A-Z0-9_]*\(\s*{re.escape(name[i:])}\s*[,)]", text)
               for i in range(4, len(name)))  # fmt: skip


def test_pasted_kernel_names_need_their_invocation():
    text = "#define K(S) void kern_##S(int);\nK(r1)\nK(m64)\n"
    assert _pasted("kern_r1", text) and _pasted("kern_m64", text)
    assert not _pasted("kern_r8", text) and not _pasted("kernel_r1", text)


def test_every_registered_kernel_is_defined_in_its_source():
    for name, (source, signature) in KERNELS.items():
        assert source in source_names()
        text = load_source(source)
        assert f" {name}(" in text or _pasted(name, text), name
        assert set(signature) <= set("piuqf")


class Status(IntEnum):
    SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2


class HipStatus(IntEnum):
    hipErrorOutOfMemory = 2


@pytest.mark.parametrize("check", [nvidia.check, amd.check])
def test_check_unwraps_and_types_errors(check):
    assert check((Status.SUCCESS,)) is None
    assert check((Status.SUCCESS, 5)) == 5
    assert check((Status.SUCCESS, 1, 2)) == (1, 2)
    with pytest.raises(ForgeRuntimeError, match="myCall failed: CUDA_ERROR_INVALID_VALUE"):
        check((Status.CUDA_ERROR_INVALID_VALUE,), "myCall")
    oom = (
        Status.CUDA_ERROR_OUT_OF_MEMORY if check is nvidia.check else HipStatus.hipErrorOutOfMemory
    )
    with pytest.raises(OutOfMemoryError):
        check((oom, None), "alloc")


def test_library_override_and_hiprtc_fallback(monkeypatch):
    monkeypatch.setenv("FORGE_HIPRTC_LIBRARY", "/opt/x/libhiprtc.so.6")
    assert rocm_libs.resolve("hiprtc", b"libhiprtc.so") == "/opt/x/libhiprtc.so.6"
    monkeypatch.delenv("FORGE_HIPRTC_LIBRARY")
    monkeypatch.setattr(rocm_libs, "_loadable", lambda name: name == "libamdhip64.so.5")
    monkeypatch.setattr(
        rocm_libs.ctypes.util,
        "find_library",
        lambda n: "libamdhip64.so.5" if n == "amdhip64" else None,
    )
    monkeypatch.setattr(rocm_libs, "_exports", lambda name, sym: name == "libamdhip64.so.5")
    # runtime package only (no -dev symlink): the versioned soname is used
    assert rocm_libs.resolve("amdhip64", b"libamdhip64.so") == "libamdhip64.so.5"
    # ROCm < 5.3 has no libhiprtc: hiprtc* live in libamdhip64
    assert rocm_libs.resolve("hiprtc", b"libhiprtc.so") == "libamdhip64.so.5"
    monkeypatch.setattr(rocm_libs, "_exports", lambda name, sym: False)
    assert rocm_libs.resolve("hiprtc", b"libhiprtc.so") == "libhiprtc.so"


def test_open_runtime_without_gpu_says_why():
    from forge_hip.probe import probe_amd, probe_nvidia

    if probe_amd().devices or probe_nvidia().devices:
        pytest.skip("a GPU is present")
    with pytest.raises(BackendUnavailableError, match="amd: .*nvidia: "):
        open_runtime()
