"""benchmarks/block_timeline.py rewrites a copy of kernels/: its anchors must still be there, and
the copy must keep the plain no-op wait for AMD and the host harness."""

from __future__ import annotations

import sys
from pathlib import Path

from forge_hip.sources import kernel_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import block_timeline  # noqa: E402


def test_traced_copy_records_on_nvidia_only(tmp_path):
    block_timeline.traced_kernels(kernel_dir(), tmp_path)
    header = (tmp_path / "forge_hip.h").read_text()
    at = header.index("#define FORGE_TRACE_MARK(tag) forge_tr_.mark(tag)")
    nv, other = header[:at], header[at:].split("#else", 1)[1].split("#endif", 1)[0]
    assert "forge_trace_buf" in nv and "griddepcontrol.wait" in nv
    assert "#define FORGE_GRID_WAIT()" in other and "griddepcontrol" not in other
    assert "#define FORGE_TRACE_MARK(tag) (void)0" in header
    assert (tmp_path / "mmv.hip").read_text().count("FORGE_TRACE_MARK(") == 1
    names = {f.name for f in kernel_dir().iterdir() if f.is_file()}
    assert names == {f.name for f in tmp_path.iterdir()}
    untouched = names - {"forge_hip.h", "mmv.hip"}
    assert all((tmp_path / n).read_text() == (kernel_dir() / n).read_text() for n in untouched)
