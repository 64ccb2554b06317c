"""Make hip-python find the HIP runtime and hipRTC of distribution packages (Debian's ROCm 5.x).

hip-python resolves each library lazily, on the first call into it, through
`rocm.bindings.util.paths.get_library_path(shortname)`: a bundled copy, the `rocm_sdk` wheels,
`$ROCM_PATH/lib/lib<shortname>.so` (default /opt/rocm), and finally the bare name
`lib<shortname>.so` handed to dlopen. Debian installs ROCm into the multiarch directory instead:
- `libamdhip64.so` exists only with `libamdhip64-dev` (the runtime package has `libamdhip64.so.5`);
- there is no `libhiprtc.so` at all: before ROCm 5.3 the hiprtc* functions live in libamdhip64.

`install_resolver()` wraps that function (before hip-python's first call) so that when its answer is
a bare name the dynamic loader cannot open, a versioned soname found by `ctypes.util.find_library`
is used instead, and hiprtc falls back to libamdhip64 when that library exports hiprtcCreateProgram.
No symlinks, no root and no environment changes are needed. `FORGE_HIP_LIBRARY` and
`FORGE_HIPRTC_LIBRARY` name the files explicitly when the search finds the wrong ones.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_OVERRIDES = {"amdhip64": "FORGE_HIP_LIBRARY", "hiprtc": "FORGE_HIPRTC_LIBRARY"}
_installed = False


def _loadable(name: str) -> bool:
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


def _exports(name: str, symbol: str) -> bool:
    try:
        return hasattr(ctypes.CDLL(name), symbol)
    except OSError:
        return False


def resolve(shortname: str, default: str | bytes) -> str:
    """The library file hip-python should open for `shortname`, given hip-python's own answer."""
    env = os.environ.get(_OVERRIDES.get(shortname, ""), "")
    if env:
        return env
    answer = os.fsdecode(default)
    if os.path.isabs(answer) or _loadable(answer):
        return answer
    versioned = ctypes.util.find_library(shortname)
    if versioned and _loadable(versioned):
        return versioned
    if shortname == "hiprtc":
        hip = resolve("amdhip64", "libamdhip64.so")
        if _exports(hip, "hiprtcCreateProgram"):
            return hip
    return answer


def install_resolver() -> bool:
    """Wrap hip-python's library lookup once. Returns False when hip-python is not importable."""
    global _installed
    if _installed:
        return True
    try:
        from rocm.bindings.util import paths
    except ImportError:
        return False
    original = paths.get_library_path

    def get_library_path(shortname, bundled_location=None):
        return os.fsencode(resolve(shortname, original(shortname, bundled_location)))

    paths.get_library_path = get_library_path
    _installed = True
    return True
