"""Runtime basics on the device: copies, events, the compile cache, OOM, and graph replay."""

from __future__ import annotations

import time

import numpy as np
import pytest
from forge_hip.runtime.cache import cache_dir

from forge.errors import OutOfMemoryError


def probe_kernels(lib):
    """probe_add and probe_scale (tests/support/third_party_kernels/probe.hip), marked as
    overlapping their predecessor as forge's own kernels are: both start with the grid wait."""
    from dataclasses import replace

    from forge_hip.library import HipKernel

    from tests.support.gpu_helpers import THIRD_PARTY_KERNELS

    return [replace(lib.resolve(HipKernel("probe.hip", name, directory=THIRD_PARTY_KERNELS)),
                    overlaps=True) for name in ("probe_add", "probe_scale")]  # fmt: skip


def test_copies_round_trip(rt, dev):
    x = np.random.default_rng().integers(0, 2**31, size=12345, dtype=np.int32)
    a = dev.put(x)
    b = dev.poisoned(x.nbytes)
    rt.copy_device(b, a, x.nbytes)
    np.testing.assert_array_equal(dev.get(b, x.shape, np.int32), x)


def test_out_of_memory_is_typed(rt):
    with pytest.raises(OutOfMemoryError):
        rt.alloc(rt.props.memory_total * 4)


def test_compile_cache_hit(rt):
    name = f"cache_probe_{time.time_ns()}"
    src = f'extern "C" __global__ void {name}(float* x) {{ x[0] = 1.0f; }}'
    t0 = time.perf_counter()
    first = rt.compile(src, "probe")
    t1 = time.perf_counter()
    second = rt.compile(src, "probe")
    t2 = time.perf_counter()
    assert first == second and len(list(cache_dir().glob("*.bin"))) > 0
    print(f"compile {1e3 * (t1 - t0):.1f} ms, cached {1e3 * (t2 - t1):.2f} ms")


def test_graph_replay_matches_direct_launches_and_is_faster(rt, lib, dev):
    n, steps = 4096, 200
    x = np.random.default_rng().standard_normal(n).astype(np.float32)
    a, b = dev.put(x), dev.put(np.ones(n, np.float32))
    add, scale = probe_kernels(lib)
    stream = rt.stream()
    rt.begin_capture(stream)
    for _ in range(steps):  # a chain of small kernels, like a decode step
        rt.launch(add, (4,), (256,), [a, b, a, n], stream=stream)
        rt.launch(scale, (4,), (256,), [a, a, 0.5, n], stream=stream)
    graph = rt.end_capture(stream)
    rt.synchronize(stream)
    np.testing.assert_array_equal(dev.get(a, (n,)), x)  # capture ran nothing

    start, end = rt.event(), rt.event()
    rt.record(start, stream)
    rt.replay(graph, stream)
    rt.record(end, stream)
    graph_ms = rt.elapsed_ms(start, end)
    ref = x.copy()
    for _ in range(steps):
        ref = (ref + np.float32(1)) * np.float32(0.5)
    np.testing.assert_allclose(dev.get(a, (n,)), ref, rtol=1e-6)

    rt.record(start, stream)
    for _ in range(steps):
        rt.launch(add, (4,), (256,), [a, b, a, n], stream=stream)
        rt.launch(scale, (4,), (256,), [a, a, 0.5, n], stream=stream)
    rt.record(end, stream)
    direct_ms = rt.elapsed_ms(start, end)
    per = 1e3 / (2 * steps)
    print(
        f"{2 * steps} kernels: graph {graph_ms * per:.2f} us/kernel, "
        f"direct {direct_ms * per:.2f} us/kernel"
    )
    assert graph_ms < direct_ms


@pytest.mark.parametrize("blocks", [4, 4096])
def test_overlapped_graph_launches_keep_their_order(rt, lib, dev, blocks):
    """Kernels captured with overlap (programmatic dependent launch on sm_90+) still see every
    write of the kernel before them: a chain of read-modify-write kernels over one buffer, large
    grids (many blocks still running when the next kernel's blocks start) and small ones."""
    n, steps = blocks * 256, 100
    x = np.random.default_rng().standard_normal(n).astype(np.float32)
    a, b = dev.put(x), dev.put(np.ones(n, np.float32))
    add, scale = probe_kernels(lib)
    stream = rt.stream()
    timings = {}
    for overlap in (False, True):
        rt.copy_to_device(a, x)
        rt.begin_capture(stream)
        for _ in range(steps):
            rt.launch(add, (blocks,), (256,), [a, b, a, n], stream=stream, overlap=overlap)
            rt.launch(scale, (blocks,), (256,), [a, a, 0.5, n], stream=stream, overlap=overlap)
        graph = rt.end_capture(stream)
        start, end = rt.event(), rt.event()
        rt.record(start, stream)
        rt.replay(graph, stream)
        rt.record(end, stream)
        timings[overlap] = 1e3 * rt.elapsed_ms(start, end) / (2 * steps)
        ref = x.copy()
        for _ in range(steps):
            ref = (ref + np.float32(1)) * np.float32(0.5)
        np.testing.assert_allclose(dev.get(a, (n,)), ref, rtol=1e-6)
    print(f"{blocks} blocks: {timings[False]:.2f} us/kernel plain, {timings[True]:.2f} overlapped")
