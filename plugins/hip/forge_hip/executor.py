"""Kernel launches on one stream: counted, optionally timed with events, or captured into graphs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from forge_hip.runtime.base import Kernel, Runtime


class Launcher:
    """Launches kernels on `stream`. While `profiling`, every launch is bracketed by two events so
    that `timings()` can say where the time of a step went. While `capturing` (a graph), kernels
    that allow it are launched to overlap their predecessor's end (`Runtime.launch`'s overlap),
    unless `overlap` is turned off; plain launches stay plain (the call costs more in Python)."""

    def __init__(self, rt: Runtime, stream: Any):
        self.rt, self.stream = rt, stream
        self.count = 0
        self.overlap = True
        self.capturing = False
        self._events: list[tuple[str, Any, Any]] | None = None

    def __call__(
        self, kernel: Kernel, grid: Sequence[int], block: Sequence[int], args: Sequence[Any]
    ) -> None:
        self.count += 1
        if self._events is None:
            if self.capturing and self.overlap and kernel.overlaps:
                self.rt.launch(kernel, grid, block, args, stream=self.stream, overlap=True)
            else:
                self.rt.launch(kernel, grid, block, args, stream=self.stream)
            return
        start, end = self.rt.event(), self.rt.event()
        self.rt.record(start, self.stream)
        self.rt.launch(kernel, grid, block, args, stream=self.stream)
        self.rt.record(end, self.stream)
        self._events.append((kernel.name, start, end))

    def start_profile(self) -> None:
        self._events = []

    def stop_profile(self) -> dict[str, tuple[int, float]]:
        """{kernel name: (launches, total milliseconds)} since `start_profile`."""
        events, self._events = self._events or [], None
        out: dict[str, tuple[int, float]] = {}
        for name, start, end in events:
            n, ms = out.get(name, (0, 0.0))
            out[name] = (n + 1, ms + self.rt.elapsed_ms(start, end))
        return out


class GraphCache:
    """One captured graph per key (a decode batch size, a pass's row count), replayed on the
    launcher's stream."""

    def __init__(self, launcher: Launcher):
        self.launcher = launcher
        self.graphs: dict[Any, Any] = {}
        self.kernels: dict[Any, int] = {}  # launches captured per graph

    def capture(self, key: Any, enqueue: Callable[[], None]) -> None:
        """Capture `enqueue()`'s launches as the graph for `key`; nothing runs."""
        rt, stream = self.launcher.rt, self.launcher.stream
        before = self.launcher.count
        rt.begin_capture(stream)
        self.launcher.capturing = True
        try:
            enqueue()
        finally:
            self.launcher.capturing = False
            graph = rt.end_capture(stream)
        self.graphs[key] = graph
        self.kernels[key] = self.launcher.count - before

    def run(self, key: Any, enqueue: Callable[[], None]) -> None:
        """Replay the graph for `key`, capturing `enqueue()`'s launches first if it is new."""
        if key not in self.graphs:
            self.capture(key, enqueue)
        self.launcher.rt.replay(self.graphs[key], self.launcher.stream)

    def clear(self) -> None:
        """Forget every graph (buffers they point at changed)."""
        self.graphs.clear()
        self.kernels.clear()
