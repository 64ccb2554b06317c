"""Streaming batches: the scheduler-to-event-loop hand-off (`_Inbox`) and SSE events that carry
several tokens at once. In-process (Starlette's TestClient) on the tiny golden llama-f32; with the
hand-off held back until a request finished, its stream gets every token in one batch, and the
one event it sends must say exactly what one event per token would (text, per-token logprobs,
finish reason, usage)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import warnings

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from forge.config import ServerConfig  # noqa: E402
from forge.scheduler import Finished  # noqa: E402
from forge.server import create_app  # noqa: E402
from forge.server import service as service_module  # noqa: E402

NO_EOS = {"2": -100}  # llama-f32's EOS id: generations run to max_tokens


@pytest.fixture(scope="module")
def client(golden_dir):
    from forge.api import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load(str(golden_dir / "models" / "llama-f32.gguf"), backend="cpu_simd",
                     n_ctx=1024)  # fmt: skip
    with TestClient(create_app(model, ServerConfig())) as c:
        yield c


@pytest.fixture
def held(monkeypatch):
    """Hand nothing to the event loop before a Finished is queued: each stream then gets all its
    messages in one batch, as a stream far behind the scheduler would."""
    deliver = service_module._Inbox._deliver

    def held_deliver(self):
        if any(isinstance(item[1], Finished) for item in list(self._items)):
            deliver(self)
        else:  # still scheduled: poll again shortly
            self._loop.call_later(0.002, self._deliver)

    monkeypatch.setattr(service_module._Inbox, "_deliver", held_deliver)


def _events(client, path: str, body: dict) -> list:
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(x.startswith("data: ") for x in lines)
    return [json.loads(x[6:]) for x in lines[:-1]]


def _whole(client, path: str, body: dict) -> dict:
    r = client.post(path, json={**body, "stream": False})
    assert r.status_code == 200, r.text
    return r.json()


COMPLETION = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0,
              "logit_bias": NO_EOS, "stream_options": {"include_usage": True}}  # fmt: skip


def _concat_logprobs(chunks: list[dict]) -> dict:
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        for key in out:
            out[key] += c["choices"][0]["logprobs"][key]
    return out


@pytest.mark.parametrize("logprobs", [None, 3])
def test_held_completion_stream_is_one_event_equal_to_the_whole(client, held, logprobs):
    body = {**COMPLETION, "logprobs": logprobs}
    whole = _whole(client, "/v1/completions", body)
    events = _events(client, "/v1/completions", body)
    text_chunks = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"] is None]
    assert len(text_chunks) == 1  # 24 tokens, one event
    assert text_chunks[0]["choices"][0]["text"] == whole["choices"][0]["text"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"] == whole["usage"] and whole["usage"]["completion_tokens"] == 24
    if logprobs:
        got, want = text_chunks[0]["choices"][0]["logprobs"], whole["choices"][0]["logprobs"]
        assert len(got["tokens"]) == 24
        assert {k: got[k] for k in ("tokens", "text_offset")} == {
            k: want[k] for k in ("tokens", "text_offset")
        }
        assert got["token_logprobs"] == pytest.approx(want["token_logprobs"], abs=1e-4)


def test_streamed_logprobs_concatenate_to_the_whole(client):
    """Without holding back (events of one or more tokens), text offsets run on across events."""
    body = {**COMPLETION, "logprobs": 2}
    whole = _whole(client, "/v1/completions", body)["choices"][0]
    events = _events(client, "/v1/completions", body)
    chunks = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"] is None]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    got = _concat_logprobs(chunks)
    assert got["tokens"] == whole["logprobs"]["tokens"]
    assert got["text_offset"] == whole["logprobs"]["text_offset"]
    assert got["token_logprobs"] == pytest.approx(whole["logprobs"]["token_logprobs"], abs=1e-4)


def test_held_stream_stops_exactly_at_a_stop_string(client, held):
    reference = _whole(client, "/v1/completions", COMPLETION)["choices"][0]["text"]
    stop = reference[len(reference) // 2 :][:3]
    body = {**COMPLETION, "stop": [stop]}
    events = _events(client, "/v1/completions", body)
    text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    assert text == reference[: reference.find(stop)]
    assert text == _whole(client, "/v1/completions", body)["choices"][0]["text"]
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "stop"


def test_held_chat_stream_is_one_content_event(client, held):
    body = {"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 12,
            "temperature": 0, "logit_bias": NO_EOS, "logprobs": True, "top_logprobs": 2,
            "stream_options": {"include_usage": True}}  # fmt: skip
    whole = _whole(client, "/v1/chat/completions", body)
    events = _events(client, "/v1/chat/completions", body)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [e for e in events[1:] if e["choices"] and "content" in e["choices"][0]["delta"]]
    assert len(content) == 1
    assert content[0]["choices"][0]["delta"]["content"] == whole["choices"][0]["message"]["content"]
    got = content[0]["choices"][0]["logprobs"]["content"]
    want = whole["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in got] == [c["token"] for c in want] and len(got) == 12
    assert all(len(c["top_logprobs"]) == 2 for c in got)
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"] == whole["usage"]


def test_inbox_wakes_the_loop_once_per_batch():
    """Messages put from another thread while the loop is busy arrive in order, in one call."""

    class Sink:
        def __init__(self):
            self.got = []

        def _arrived(self, message, at):
            self.got.append(message)

    async def main():
        inbox = service_module._Inbox(asyncio.get_running_loop(), 0.0)
        calls = []
        deliver = inbox._deliver
        inbox._deliver = lambda: (calls.append(1), deliver())
        a, b = Sink(), Sink()

        def scheduler():
            for i in range(50):
                inbox.put(a, i)
                inbox.put(b, -i)

        t = threading.Thread(target=scheduler)
        t.start()
        t.join()  # the loop is blocked meanwhile, as while a handler runs
        await asyncio.sleep(0.01)
        assert len(calls) == 1
        assert a.got == list(range(50)) and b.got == [-i for i in range(50)]
        inbox.put(a, 50)  # the next batch wakes the loop again
        await asyncio.sleep(0.01)
        assert len(calls) == 2 and a.got[-1] == 50

    asyncio.run(main())


def test_inbox_hands_over_at_most_once_per_interval():
    class Sink:
        def __init__(self):
            self.times = []

        def _arrived(self, message, at):
            self.times.append(time.perf_counter())

    async def main():
        inbox = service_module._Inbox(asyncio.get_running_loop(), 0.05)
        sink = Sink()
        inbox.put(sink, 0)  # after a quiet spell: at once
        await asyncio.sleep(0.005)
        assert len(sink.times) == 1
        for i in range(1, 4):
            threading.Thread(target=inbox.put, args=(sink, i)).start()
            await asyncio.sleep(0.005)
        assert len(sink.times) == 1  # held until the interval is over, then all together
        await asyncio.sleep(0.1)
        assert len(sink.times) == 4 and sink.times[1] - sink.times[0] >= 0.045
        assert sink.times[3] - sink.times[1] < 0.005

    asyncio.run(main())
