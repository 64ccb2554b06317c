"""A loaded model made to say chosen tokens: its runner's forward still runs (the cache fills
as usual), but the last logits row of a sequence past a registered prompt is replaced by one
that peaks at the next scripted token. For tests of what surrounds generation (reply parsing,
streaming, the server), where a random-weight model would say nothing in particular."""

from __future__ import annotations

import numpy as np


class ScriptedReplies:
    """`expect(prompt_ids, reply_ids)`: a sequence whose tokens start with `prompt_ids` is
    answered with `reply_ids` (then the end-of-generation token)."""

    def __init__(self, model):
        self.model = model
        self._scripts: list[tuple[list[int], list[int]]] = []
        self._forward = model.runner.forward
        model.runner.forward = self._scripted_forward  # the instance attribute wins

    def expect(self, prompt_ids: list[int], reply_ids: list[int]) -> None:
        self._scripts.append((list(prompt_ids), list(reply_ids) + [self.model.tokenizer.eos_id]))

    def _scripted_forward(self, batch):
        rows = self._forward(batch)
        for b, r in zip(batch, rows):
            end = b.start + len(b.tokens)  # positions this sequence has after the pass
            for prompt, reply in self._scripts:
                k = end - len(prompt)
                if r is not None and 0 <= k < len(reply):
                    r[-1] = np.where(np.arange(r.shape[1]) == reply[k], 100.0, 0.0)
        return rows
