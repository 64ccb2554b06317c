"""A recording fake of forge_hip's Runtime: launches and copies are recorded, device memory is a
counter of addresses. Host tests of the hip runner and plan run on it without a GPU."""

from __future__ import annotations

import re
import threading

import numpy as np
from forge_hip.runtime.base import ArgPack, DeviceBuffer, DeviceProps, Kernel

from forge.errors import ForgeRuntimeError, OutOfMemoryError


class FakeRuntime:
    """Records launches and copies; device memory is a counter of addresses."""

    platform = "fake"

    def __init__(self, free=80 << 30, fail_upload_at=None):
        self.props = DeviceProps("Fake GPU", "sm_90", 96 << 30, free, 132, 32, "fake-1")
        self.free_bytes, self.fail_upload_at = free, fail_upload_at
        self.next, self.live, self.uploads = 1 << 32, {}, 0
        self.launches, self.capturing, self.replays = [], False, 0
        self.launch_args: list[tuple[str, list[int]]] = []
        self.blocks: list[tuple[int, ...]] = []
        self.shared: list[int] = []  # each launch's dynamic shared memory
        self.bound_threads: list[int] = []

    def bind(self):
        self.bound_threads.append(threading.get_ident())

    def alloc(self, n):
        if n > self.free_bytes:
            raise OutOfMemoryError("fake alloc")
        buf = DeviceBuffer(self.next, n)
        self.live[buf.ptr] = n
        self.next += (n + 511) // 256 * 256
        return buf

    def free(self, buf):
        self.live.pop(buf.ptr, None)
        buf.ptr = 0

    def free_memory(self):
        return self.free_bytes - sum(self.live.values())

    def copy_to_device(self, dst, src, stream=None):
        self.uploads += 1
        if self.uploads == self.fail_upload_at:
            raise ForgeRuntimeError("injected upload failure")

    def copy_to_host(self, dst, src, stream=None):
        dst[...] = 0

    def stream(self):
        return "stream"

    def synchronize(self, stream=None):
        pass

    def event(self):
        return object()

    def record(self, event, stream=None):
        pass

    def elapsed_ms(self, a, b):
        return 0.001

    def wait(self, event):
        pass

    def alloc_host(self, n):
        return np.zeros(n, np.uint8)

    def free_host(self, array):
        pass

    def compile(self, source, name, flags=()):
        return source.encode()

    def load(self, binary):
        return binary

    def function(self, module, name, signature):
        src = module.decode()  # macro-made kernels (embed_q4_k) show their suffix only
        pasted = re.findall(r"(\w+)##\w+\(", src)  # or a name pasted together (mmq_glu_m##MT)
        assert (f" {name}(" in src or f"({name.split('_', 1)[-1]}," in src
                or any(name.startswith(p) for p in pasted)), name  # fmt: skip
        return Kernel(None, name, signature)

    def launch(self, kernel, grid, block, args, shared=None, stream=None, overlap=False):
        ArgPack(kernel.signature, args)  # raises on a wrong argument count or type
        assert overlap == (self.capturing and kernel.overlaps)  # only graph launches overlap
        assert all(int(g) >= 1 for g in grid) and int(block[0]) <= 1024
        self.launches.append((kernel.name, tuple(grid), self.capturing))
        self.shared.append(kernel.shared if shared is None else shared)  # as the runtimes do
        self.blocks.append(tuple(block))
        self.launch_args.append((kernel.name, [int(getattr(a, "ptr", a)) for a in args]))

    def begin_capture(self, stream):
        self.capturing = True

    def end_capture(self, stream):
        self.capturing = False
        return "graph"

    def replay(self, graph, stream):
        self.replays += 1

    def close(self):
        pass
