"""`SamplingContext`: what a sampler remembers between tokens."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


class SamplingContext:
    """The tokens so far (prompt + generated) and the random generator of one sequence.

    ``rng`` is a NumPy Generator seeded from ``seed``: two contexts made with the same seed
    and fed the same logits and tokens make the same choices. ``seed=None`` draws fresh entropy.
    ``tokenizer`` is the model's `forge.tokenizer.Tokenizer` (None when the sampler was built
    without one), for stages that need token texts, such as ``grammar``.
    """

    def __init__(
        self, tokens: Iterable[int] = (), seed: int | None = None, tokenizer: Any = None
    ) -> None:
        self.tokens: list[int] = [int(t) for t in tokens]
        self.prompt_len = len(self.tokens)  # tokens[:prompt_len] came from the prompt
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.tokenizer = tokenizer

    def accept(self, token: int) -> None:
        """Record a token chosen (or forced) for this sequence."""
        self.tokens.append(int(token))

    def recent(self, n: int) -> np.ndarray:
        """The last ``n`` tokens as int64 (all of them for ``n == -1``, none for ``n == 0``)."""
        if n == 0:
            return np.empty(0, dtype=np.int64)
        window = self.tokens if n < 0 else self.tokens[-n:]
        return np.fromiter(window, dtype=np.int64, count=len(window))

    @property
    def generated(self) -> list[int]:
        """The tokens accepted after the prompt."""
        return self.tokens[self.prompt_len :]
