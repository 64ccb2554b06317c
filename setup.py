"""Build hook: the wheel (and a non-editable install) carries the HIP kernel sources.

The sources live in the top-level kernels/ folder, shared by both GPU platforms and compiled at
run time; `forge_hip.sources.kernel_dir` looks for them inside the installed package first. An
editable install reads them from the checkout instead.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

KERNEL_PATTERNS = ("*.hip", "*.h")


class BuildPyWithKernels(build_py):
    """build_py, then kernels/*.hip and kernels/*.h copied into forge_hip/kernels."""

    def run(self) -> None:
        super().run()
        source = Path(__file__).resolve().parent / "kernels"
        target = Path(self.build_lib) / "forge_hip" / "kernels"
        files = sorted(p for pattern in KERNEL_PATTERNS for p in source.glob(pattern))
        if not files:
            raise RuntimeError(f"no kernel sources found in {source}")
        self.mkpath(str(target))
        for path in files:
            self.copy_file(str(path), str(target / path.name))


setup(cmdclass={"build_py": BuildPyWithKernels})
