"""Kernel headers compiled as plain host C++ (FORGE_HOST) into a shared library, so their device
functions can be checked on the CPU without a GPU. Warnings are errors, as in the hipcc test."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
from forge_hip.sources import kernel_dir


def build_host_library(workdir: Path, source: str) -> ctypes.CDLL:
    """Compile `source` (which includes kernel headers) with g++ or clang++ and load it;
    skips the calling test when no host compiler exists."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler (g++ or clang++)")
    (workdir / "h.cpp").write_text(source)
    cmd = [cxx, "-O1", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas",
           f"-I{kernel_dir()}", str(workdir / "h.cpp"), "-o", str(workdir / "h.so")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return ctypes.CDLL(str(workdir / "h.so"))
