"""One sequence's generation state: sampling, streaming text, stop conditions.

Shared by `Model.generate` (one sequence) and the server's batch scheduler (many), so both stop,
detokenize and report finish reasons the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from forge.backend import DeviceSampling
from forge.sampling import Sampler
from forge.sampling.pickers import dist_pick
from forge.sampling.stages import MinP, Temperature, TopK, TopP
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
        self._eog = tokenizer.eog_ids
        self._greedy = sampler.chain == ["greedy"] and logprobs is None  # is_greedy
        self._pending = ""  # decoded text held back because it may start a stop string
        self.text = ""  # everything emitted so far
        self._device: DeviceSampling | None | bool = False  # False: not worked out yet

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def is_greedy(self) -> bool:
        """True when the pick depends on the argmax alone (a device may pick for us)."""
        return self._greedy  # (worked out once: the scheduler asks every step, per sequence)

    def ends_with(self, token: int) -> bool:
        """True when taking `token` next certainly ends the sequence: an end-of-generation
        token, max_tokens, or the context full (a stop string needs the text: only `take` finds
        it)."""
        return token in self._eog or self.full_after(1)

    def full_after(self, ahead: int) -> bool:
        """True when `ahead` more tokens certainly end the sequence by count (max_tokens, or the
        context full), whatever they are."""
        return self._full(len(self.generated) + ahead)

    def _full(self, n_generated: int) -> bool:
        """Whether `n_generated` tokens reach max_tokens or fill the context."""
        return n_generated >= self.max_tokens or len(self.prompt) + n_generated >= self.n_ctx

    def device_pick(self, ahead: int = 0) -> DeviceSampling | None:
        """How a device may pick this sequence's next token (`Runner.forward_sample`), or None
        when the host must: logprobs asked for, or a stage or picker other than the built-in
        top_k, top_p, min_p, temperature (in that order) and dist/greedy (penalties and
        logit_bias keep the host path). The draw's key is the seed (else one draw from the
        sampler's generator, once) and its counter the index of the token being picked, so a
        seed gives the same tokens on every run. `ahead` counts tokens already picked that
        `take` has not seen yet (the pick is for the token after them)."""
        if self.logprobs is not None:
            return None
        if self.is_greedy:
            return DeviceSampling()
        if self._device is False:
            self._device = _device_sampling(self.sampler)
        if self._device is None:
            return None
        return replace(self._device, counter=len(self.generated) + ahead)

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
        if token in self._eog:
            return TokenEvent(token, self._finish("stop"))
        text = self._release(self._decoder.push(token))
        if self.finish_reason is None and self._full(len(self.generated)):
            text += self._finish("length")
        return TokenEvent(token, text)

    def cancel(self, reason: str = "cancelled") -> None:
        if self.finish_reason is None:
            self.finish_reason = reason

    def _release(self, piece: str) -> str:
        if not self.stop:  # nothing to hold back
            self.text += piece
            return piece
        self._pending += piece
        for s in self.stop:
            at = self._pending.find(s)
            if at >= 0:
                out, self._pending = self._pending[:at], ""
                self.finish_reason = "stop"
                self.text += out
                return out
        keep = max((overlap(self._pending, s) for s in self.stop), default=0)
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


_DEVICE_STAGES = (TopK, TopP, MinP, Temperature)  # in the order a device applies them


def _device_sampling(sampler: Sampler) -> DeviceSampling | None:
    """The DeviceSampling equal to a built sampler's chain, or None when it has other parts."""
    if sampler.picker[1] is not dist_pick:
        return None
    found: dict[type, object] = {}
    last = -1
    for _, stage in sampler.stages:
        kind = type(stage)
        if kind not in _DEVICE_STAGES or _DEVICE_STAGES.index(kind) <= last:
            return None
        last = _DEVICE_STAGES.index(kind)
        found[kind] = stage
    temperature = found[Temperature].t if Temperature in found else 1.0
    if temperature <= 0.0:  # a zero-temperature stage before dist: ties drawn at random
        return None
    params = sampler.params
    min_p = 0.0
    if MinP in found:  # the value whose log the stage holds, exactly
        log_p = found[MinP].log_p
        min_p = (
            params.min_p
            if params.min_p > 0 and math.log(params.min_p) == log_p
            else math.exp(log_p)
        )
    key = params.seed if params.seed is not None else int(sampler.ctx.rng.integers(0, 2**63))
    return DeviceSampling(
        temperature=temperature,
        top_k=found[TopK].k if TopK in found else 0,
        top_p=found[TopP].p if TopP in found else 1.0,
        min_p=min_p,
        key=key & 0xFFFFFFFFFFFFFFFF,
    )


def overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
