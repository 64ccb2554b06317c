"""Which passes replay a captured graph, and which graphs a scheduler's runner captures ahead.

Launched one by one from Python a kernel costs about 14.5 us against 2.8 in a graph, so every
pass whose launches depend on its row count alone is captured once per row count: decode steps
(every sequence adds one token) of up to `decode_rows` rows, keyed by the row count, and other
passes of 2 .. `pass_rows` rows (a prompt chunk, or prompts and decode rows together), keyed
("pass", rows, one_each).
"""

from __future__ import annotations

from typing import Any

from forge_hip.tuning import Tuning


class GraphPolicy:
    """The graph keys of passes; `enabled` off launches everything directly (tests, probes)."""

    def __init__(self, tune: Tuning, out_rows: int):
        self.decode_rows = min(out_rows, tune.decode_graph_rows)
        self.pass_rows = tune.pass_graph_rows
        self.enabled = True

    def decode_key(self, rows: int, one_each: bool, masked: bool = False) -> int | tuple | None:
        """The graph of a decode step (logits and picks included; ("masked", rows) when its
        picks read token masks), or None."""
        if not (self.enabled and one_each and rows <= self.decode_rows):
            return None
        return ("masked", rows) if masked else rows

    def pass_key(self, rows: int, one_each: bool) -> tuple | None:
        """The graph of a pass's layers (its output launched after), or None."""
        if self.enabled and 1 < rows <= self.pass_rows:
            return ("pass", rows, one_each)
        return None

    def keys_for(self, max_seqs: int) -> list[Any]:
        """Every key a scheduler of `max_seqs` sequences replays: decode steps of 1 .. max_seqs
        rows (up to decode_rows), passes of 2 .. pass_rows rows, and the decode steps past
        decode_rows, which run as passes of one token per sequence."""
        if not self.enabled:
            return []
        wide = range(self.decode_rows + 1, min(max_seqs, self.pass_rows) + 1)
        return [*range(1, min(max_seqs, self.decode_rows) + 1),
                *(("pass", r, False) for r in range(2, self.pass_rows + 1)),
                *(("pass", r, True) for r in wide)]  # fmt: skip
