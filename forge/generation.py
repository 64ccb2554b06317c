"""One sequence's generation state: sampling, streaming text, stop conditions.

Shared by `Model.generate` (one sequence) and the server's batch scheduler (many), so both stop,
detokenize and report finish reasons the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from forge.sampling import Sampler
from forge.tokenizer import StreamDecoder, Tokenizer


@dataclass
class TokenEvent:
    """What one generated token produced."""

    token: int
    text: str  # text now safe to show (may be empty while UTF-8 or a stop string is pending)
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


class SequenceState:
    """Generation state of one sequence, fed one logits row per step."""

    def __init__(
        self,
        prompt: list[int],
        tokenizer: Tokenizer,
        sampler: Sampler,
        *,
        max_tokens: int,
        n_ctx: int,
        stop: list[str] | None = None,
        logprobs: int | None = None,
    ):
        self.prompt = list(prompt)
        self.tokenizer, self.sampler = tokenizer, sampler
        self.max_tokens, self.n_ctx = max_tokens, n_ctx
        self.stop = [s for s in (stop or []) if s]
        self.logprobs = logprobs
        self.generated: list[int] = []
        self.finish_reason: str | None = None
        self._decoder = StreamDecoder(tokenizer)
        self._pending = ""  # decoded text held back because it may start a stop string
        self.text = ""  # everything emitted so far

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def is_greedy(self) -> bool:
        """True when the pick depends on the argmax alone (a device may pick for us)."""
        return self.sampler.chain == ["greedy"] and not self.logprobs

    def step(self, logits: np.ndarray) -> TokenEvent:
        """Sample from a logits row [n_vocab] and take the token."""
        token = self.sampler.sample(logits)
        event = self.take(token)
        if self.logprobs is not None:
            row = logits.astype(np.float64)
            logz = np.logaddexp.reduce(row)
            event.logprob = float(row[token] - logz)
            if self.logprobs > 0:
                top = np.argpartition(-row, self.logprobs - 1)[: self.logprobs]
                top = top[np.argsort(-row[top])]
                event.top_logprobs = [(int(t), float(row[t] - logz)) for t in top]
        return event

    def take(self, token: int) -> TokenEvent:
        """Append a chosen token, update stop state, and return the text it releases."""
        self.sampler.accept(token)
        self.generated.append(token)
        if token in self.tokenizer.eog_ids:
            return TokenEvent(token, self._finish("stop"))
        text = self._release(self._decoder.push(token))
        if self.finish_reason is None:
            if len(self.generated) >= self.max_tokens:
                text += self._finish("length")
            elif len(self.prompt) + len(self.generated) >= self.n_ctx:
                text += self._finish("length")
        return TokenEvent(token, text)

    def cancel(self, reason: str = "cancelled") -> None:
        if self.finish_reason is None:
            self.finish_reason = reason

    def _release(self, piece: str) -> str:
        self._pending += piece
        for s in self.stop:
            at = self._pending.find(s)
            if at >= 0:
                out, self._pending = self._pending[:at], ""
                self.finish_reason = "stop"
                self.text += out
                return out
        keep = max((_overlap(self._pending, s) for s in self.stop), default=0)
        out = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(out) :]
        self.text += out
        return out

    def _finish(self, reason: str) -> str:
        """End the sequence and release whatever text is still held back."""
        self.finish_reason = reason
        rest = self._pending + self._decoder.flush()
        self._pending = ""
        if reason == "length":
            for s in self.stop:
                if s in rest:
                    rest = rest[: rest.find(s)]
        self.text += rest
        return rest


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
