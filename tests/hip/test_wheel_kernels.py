"""The built wheel carries every HIP kernel source, and a non-editable install finds them.

The wheel is built from this checkout, installed (without dependencies) into a fresh virtual
environment, and asked from there where its kernels are: they must be the installed copy, byte
for byte the checkout's kernels/. Where hipcc exists, the AMD compile test then runs on that
installed copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = sorted(p.name for p in (ROOT / "kernels").iterdir() if p.suffix in (".hip", ".h"))

ASK_INSTALLED = """
import json, forge_hip.sources as s
from forge_hip.contract import kernel_signatures
from forge_hip.tuning import load_tuning
d = s.kernel_dir()
print(json.dumps({"module": s.__file__, "dir": str(d), "files": s.source_names(),
                  "texts": {n: len(s.load_source(n)) for n in s.source_names()},
                  "kernels": len(kernel_signatures()), "tuning": str(load_tuning())}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the checkout (the build leaves build/ behind)."""
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src") / "forge"
    junk = (".git", ".venv", "build", "*.egg-info", "__pycache__", ".forge-cache", ".whl*")
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*junk))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("forge_llm-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> dict:
    """What the installed forge_hip says of its kernels, run from a fresh venv."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # forge's dependencies come from this environment's site-packages (a plain path entry: its
    # .pth files, among them the editable forge's, are not processed there).
    deps = sysconfig.get_paths()["purelib"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    proc = subprocess.run(
        [str(python), "-c", ASK_INSTALLED],
        capture_output=True, text=True, timeout=120, env={**env, "PYTHONPATH": deps},
        cwd=env_dir,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {**json.loads(proc.stdout), "venv": str(env_dir)}


def test_wheel_holds_every_kernel_source(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "forge_hip/tuned/default.json" in names
    packaged = sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("forge_hip/kernels/"))
    assert packaged == KERNELS
    for name in KERNELS:
        data = zipfile.ZipFile(wheel).read(f"forge_hip/kernels/{name}")
        assert data == (ROOT / "kernels" / name).read_bytes(), name


def test_installed_plugin_finds_its_own_kernels(installed):
    assert installed["module"].startswith(installed["venv"])  # not the checkout's forge_hip
    kernel_dir = Path(installed["dir"])
    assert kernel_dir.is_relative_to(installed["venv"]) and kernel_dir.name == "kernels"
    assert installed["files"] == [n for n in KERNELS if n.endswith(".hip")]
    assert all(n > 0 for n in installed["texts"].values())
    assert installed["kernels"] > 40 and installed["tuning"].startswith("Tuning(")
    for name in KERNELS:
        assert (kernel_dir / name).read_bytes() == (ROOT / "kernels" / name).read_bytes()


@pytest.mark.skipif(shutil.which("hipcc") is None, reason="hipcc not installed (CI installs it)")
def test_amd_compile_test_runs_on_the_installed_copy(installed):
    """The hipcc compile test, pointed at the installed kernels (FORGE_KERNEL_DIR)."""
    env = {**os.environ, "FORGE_KERNEL_DIR": installed["dir"]}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(ROOT / "tests" / "hip" / "test_hip_compile.py"), "-k", "hipcc_compiles and layer"],
        capture_output=True, text=True, timeout=900, env=env, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " passed" in proc.stdout and "failed" not in proc.stdout
