"""Every kernel of kernels/*.hip starts with FORGE_GRID_WAIT(), so a captured decode step may
launch each one to overlap its predecessor's end (forge_hip.library marks them all `overlaps`).
A kernel without the wait would read its inputs before the kernel producing them had finished.
The few kernels that do useful work before the wait are listed here with what they read there;
a new one must be reviewed and added. Also checks what the launcher does with the flag (on a
recording runtime, no GPU needed)."""

from __future__ import annotations

import re

import pytest
from forge_hip.executor import GraphCache, Launcher
from forge_hip.library import ATT_DECODE_GROUP, ATT_DECODE_WIDTHS
from forge_hip.runtime.base import Kernel
from forge_hip.sources import kernel_dir, source_names

# kernel -> (what it reads before FORGE_GRID_WAIT(): nothing an earlier kernel of the step
# writes; the function whose body holds the wait)
ATTN_DECODE_EARLY = ("the step's row metadata, norm weights and K/V cache rows of earlier "
                     "positions (first round into registers, the rest into L2; RoPE "
                     "coefficients)", "attn_decode_head")  # fmt: skip
EARLY_WORK = {
    **{f"attn_decode_w{w}": ATTN_DECODE_EARLY for w in ATT_DECODE_WIDTHS},
    **{f"attn_decode_w{w}_g{ATT_DECODE_GROUP}": ATTN_DECODE_EARLY for w in ATT_DECODE_WIDTHS[:-1]},
    "add_norm": ("its norm weights", "add_norm"),
    "mvq_multi_##SUFFIX": ("descriptors and weights (L2 prefetch)", "mvq_body"),
    "mvq_glu_##SUFFIX": ("descriptors and weights (L2 prefetch)", "mvq_body"),
    "mvq_multi_r1n": ("descriptors and weights (L2 prefetch)", "mvq_body"),
    "mvq_glu_r1n": ("descriptors and weights (L2 prefetch)", "mvq_body"),
    "add_norm_quant": ("its norm weights", "add_norm_quant"),
    "moe_router": ("its weight row (into registers)", "moe_router"),
    **{f"attn_decode_tc{d}{q}": ("the step's row metadata, the first K/V tiles of earlier "
                                 "positions (cp.async), the RoPE table", "tcd_body")
       for d in (64, 128) for q in ("", "_q8")},
    "mmq_multi_m##MT": ("descriptors and weights (L2 prefetch)", "mmq_body"),
    "mmq_glu_m##MT": ("descriptors and weights (L2 prefetch)", "mmq_body"),
}  # fmt: skip

KERNEL = re.compile(r"FORGE_KERNEL\b[^{;]*?([\w#]+)\s*\([^)]*\)\s*\{")


def kernel_bodies(text: str) -> list[tuple[str, str]]:
    """(name, text after the opening brace) of each kernel definition; macro line ends removed."""
    text = text.replace("\\\n", "\n")
    text = re.sub(r"//[^\n]*", "", text)
    return [(m.group(1), text[m.end() :]) for m in KERNEL.finditer(text)]


@pytest.mark.parametrize("source", source_names())
def test_every_kernel_waits_first(source):
    bodies = kernel_bodies((kernel_dir() / source).read_text())
    assert bodies, f"no kernels found in {source}"
    late = [name for name, body in bodies if not body.lstrip().startswith("FORGE_GRID_WAIT();")]
    unlisted = [name for name in late if name not in EARLY_WORK]
    assert not unlisted, f"{source}: kernels not starting with FORGE_GRID_WAIT(): {unlisted}"
    text = (kernel_dir() / source).read_text().replace("\\\n", "\n")
    for name in late:  # a listed kernel still waits, in itself or the function it names
        where = EARLY_WORK[name][1]
        at = re.search(rf"\b{where}\s*\([^)]*\)\s*\{{", text)
        assert at, f"{source}: no definition of {where}"
        body = text[at.end() : text.find("\n}\n", at.end())]
        assert "FORGE_GRID_WAIT();" in body, f"{source}: {where} never waits"


def test_the_check_sees_a_missing_wait():
    ok = "FORGE_KERNEL void a(float* x) {\n    FORGE_GRID_WAIT();\n    x[0] = 1;\n}\n"
    bad = "FORGE_KERNEL void __launch_bounds__(256) b(float* x, int n) {\n    x[0] = 1;\n}\n"
    found = kernel_bodies(ok + bad)
    assert [n for n, _ in found] == ["a", "b"]
    assert [body.lstrip().startswith("FORGE_GRID_WAIT();") for _, body in found] == [True, False]


class RecordingRuntime:
    def __init__(self):
        self.calls = []

    def launch(self, kernel, grid, block, args, shared=0, stream=None, overlap=False):
        self.calls.append((kernel.name, overlap))

    def begin_capture(self, stream):
        self.calls.append(("begin", False))

    def end_capture(self, stream):
        return "graph"

    def replay(self, graph, stream):
        self.calls.append(("replay", False))


def test_only_captured_launches_of_overlapping_kernels_overlap():
    rt = RecordingRuntime()
    launch = Launcher(rt, stream=None)
    ours, theirs = Kernel(None, "ours", "", overlaps=True), Kernel(None, "theirs", "")

    def step():
        launch(ours, (1,), (32,), [])
        launch(theirs, (1,), (32,), [])

    launch(ours, (1,), (32,), [])
    GraphCache(launch).run(1, step)
    launch.overlap = False
    GraphCache(launch).run(1, step)
    expected = [("ours", False), ("begin", False), ("ours", True), ("theirs", False)]
    expected += [("replay", False), ("begin", False), ("ours", False), ("theirs", False)]
    assert rt.calls == [*expected, ("replay", False)]
