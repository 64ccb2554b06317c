"""The loaded model behind the server: its scheduler, metrics, and the asyncio bridge.

`Service.generate` submits a `SequenceState` to the scheduler and returns a `Generation`, an
async iterator of `TokenEvent`s ending with a `Finished`. The scheduler thread hands messages to
the event loop with `call_soon_threadsafe`, so handlers only ever touch an asyncio.Queue.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from forge.generation import SequenceState, TokenEvent
from forge.scheduler import Finished, Handle, Scheduler
from forge.server.metrics import Metrics
from forge.tokenizer.chat import render_chat, resolve_chat_template


def model_id(model: Any) -> str:
    """The id clients name the model by: the GGUF file's stem (e.g. "llama-q8_0"), unique per
    file and known before the model loads (general.name is often missing or shared by quants)."""
    return Path(model.path).stem


class Generation:
    """One request's stream of TokenEvents, then one Finished; `cancel()` frees its blocks."""

    def __init__(self, service: Service, state: SequenceState):
        self.service, self.state = service, state
        self.queue: asyncio.Queue = asyncio.Queue()
        self.started = time.perf_counter()
        self._last: float | None = None
        self.handle: Handle | None = None
        self.finished: Finished | None = None

    def _push(self, message: TokenEvent | Finished) -> None:  # scheduler thread
        self._loop.call_soon_threadsafe(self.queue.put_nowait, message)

    def submit(self) -> Generation:
        self._loop = asyncio.get_running_loop()
        self.handle = self.service.scheduler.submit(self.state, self._push)
        self.service.metrics.prompt_tokens.inc(len(self.state.prompt))
        return self

    async def next(self, timeout: float | None = None) -> TokenEvent | Finished:
        message = await asyncio.wait_for(self.queue.get(), timeout)
        now = time.perf_counter()
        m = self.service.metrics
        if isinstance(message, Finished):
            self.finished = message
        else:
            m.generated_tokens.inc()
            if self._last is None:
                m.ttft.observe(now - self.started)
            else:
                m.tpot.observe(now - self._last)
            self._last = now
        return message

    def cancel(self) -> None:
        if self.handle is not None and self.finished is None:
            self.handle.cancel()


class Service:
    """A loaded model, its id, scheduler and metrics."""

    def __init__(self, model: Any, *, max_batch: int, max_queue: int, metrics: Metrics):
        self.model = model
        self.id = model_id(model)
        self.created = int(time.time())
        self.metrics = metrics
        self.scheduler = Scheduler(model, max_batch=max_batch, max_queue=max_queue).start()
        self._template = resolve_chat_template(model.tokenizer)

    def generate(self, state: SequenceState) -> Generation:
        """Queue `state` (raises QueueFullError / ShuttingDownError at once)."""
        return Generation(self, state).submit()

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation rendered with the model's chat template."""
        tok = self.model.tokenizer
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
        text = render_chat(self._template, messages, bos_token=bos, eos_token=eos)
        ids = tok.encode(text, add_special=False)
        # the template usually writes BOS itself; add it only where it did not
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids.insert(0, tok.bos_id)
        return ids

    def token_text(self, token: int) -> str:
        return self.model.tokenizer.token_bytes(token).decode("utf-8", errors="replace")

    def token_bytes(self, token: int) -> list[int]:
        return list(self.model.tokenizer.token_bytes(token))

    def close(self, timeout: float | None = 30.0) -> None:
        self.scheduler.stop(timeout)
