"""GPU fixtures: one runtime and kernel library per session, skipped visibly without a GPU, and
the default model's shape twin."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from forge.errors import BackendUnavailableError
from tests.support.golden_rules import ROOT
from tests.support.gpu_helpers import Dev


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def rt():
    from forge_hip.runtime import open_runtime

    try:
        runtime = open_runtime()
    except BackendUnavailableError as exc:
        if os.environ.get("FORGE_REQUIRE_GPU") == "1":  # set by scripts/run_gpu_suite.sh
            pytest.fail(f"FORGE_REQUIRE_GPU=1 but no usable GPU: {exc.reason}")
        pytest.skip(f"no usable GPU: {exc.reason}")
    p = runtime.props
    print(
        f"\nGPU: {p.name} {p.arch} {p.compute_units} CUs warp {p.warp_size} "
        f"{p.memory_free / 2**30:.1f}/{p.memory_total / 2**30:.1f} GiB free, {p.compiler}"
    )
    yield runtime
    runtime.close()


@pytest.fixture(scope="session")
def lib(rt):
    from forge_hip.library import KernelLibrary

    return KernelLibrary(rt)


@pytest.fixture
def dev(rt):
    d = Dev(rt)
    yield d
    d.free()


@pytest.fixture(scope="session")
def twin_path(tmp_path_factory):
    """Random weights of the default model's shapes and types, built once per session."""
    spec = ROOT / "benchmarks" / "specs" / "gemma3_270m.spec.json.gz"
    out = tmp_path_factory.mktemp("twin") / "gemma3-270m-twin.gguf"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gguf_twin.py"), "build", str(spec), str(out)],
        check=True,
    )
    return str(out)
