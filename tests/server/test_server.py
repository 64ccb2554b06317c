"""`forge serve` as a subprocess on a free loopback port, driven by the official `openai` client.

The model is the tiny golden llama-f32 (float32 weights: batch composition cannot flip a greedy
pick through activation rounding); every greedy answer is compared with the engine's
single-sequence `Model.complete` in this process, and logprobs with a float64 log-softmax of
`Model.logits`.
"""

from __future__ import annotations

import json
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")

from tests.support.server import MODEL, N_CTX, Server  # noqa: E402

KEY = "test-key-123"
NO_EOS = {"2": -100}  # llama-f32's EOS id: generations run to max_tokens


@pytest.fixture(scope="module")
def model_path(golden_dir):
    return golden_dir / "models" / f"{MODEL}.gguf"


@pytest.fixture(scope="module")
def ref(model_path):
    """The same model in this process: the single-request reference."""
    from forge.api import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load(str(model_path), backend="cpu_simd", n_ctx=N_CTX)


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    srv = Server(model_path, tmp_path_factory.mktemp("srv"), "--max-batch", "8",
                 env={"FORGE_API_KEY": KEY})  # fmt: skip
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert httpx.get(server.url + "/ready").json()["model"] == MODEL


def test_completion_equals_engine(client, ref):
    want = ref.complete("The quick brown fox", max_tokens=12, temperature=0)
    got = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=12,
                                    temperature=0)  # fmt: skip
    assert got.choices[0].text == want.text
    assert got.choices[0].finish_reason == want.finish_reason == "length"
    assert got.usage.prompt_tokens == want.prompt_tokens
    assert got.usage.completion_tokens == 12 and got.usage.total_tokens == want.prompt_tokens + 12


def test_streaming_completion_and_stop(client, ref):
    want = ref.complete("Once upon a time", max_tokens=16, temperature=0)
    stream = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 16
    # a stop string cuts the text before it and reports "stop"
    stop = want.text[len(want.text) // 2 :][:3]
    got = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16,
                                    temperature=0, stop=[stop])  # fmt: skip
    assert got.choices[0].finish_reason == "stop"
    assert got.choices[0].text == want.text[: want.text.find(stop)]


def test_chat_streaming_and_not(client, ref):
    from forge.tokenizer.chat import render_chat, resolve_chat_template

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    tok = ref.tokenizer
    text = render_chat(resolve_chat_template(tok), messages, bos_token=tok.token_text(tok.bos_id))
    ids = tok.encode(text, add_special=False)
    want = ref.complete(ids, max_tokens=10, temperature=0)
    got = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10,
                                         temperature=0)  # fmt: skip
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want.text
    assert got.usage.prompt_tokens == len(ids) and got.choices[0].finish_reason == "length"
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10,
                                            temperature=0, stream=True)  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_logprobs_match_float64_softmax(client, ref):
    got = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=5,
                                    temperature=0, logprobs=3)  # fmt: skip
    prompt = ref.tokenize("Hello world")
    gen = ref.complete("Hello world", max_tokens=5, temperature=0).tokens
    rows = ref.logits(prompt + gen)[len(prompt) - 1 : -1].astype(np.float64)
    logp = rows - np.logaddexp.reduce(rows, axis=1, keepdims=True)
    lp = got.choices[0].logprobs
    want = [logp[i, t] for i, t in enumerate(gen)]
    np.testing.assert_allclose(lp.token_logprobs, want, atol=1e-3)
    for i, top in enumerate(lp.top_logprobs):  # keyed by text: byte tokens may share "\ufffd"
        assert 1 <= len(top) <= 3 and max(top.values()) == pytest.approx(logp[i].max(), abs=1e-3)
    # sampled (default temperature): without the bias an EOS could end it before 3 tokens
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                          max_tokens=3, logprobs=True, top_logprobs=2,
                                          logit_bias=NO_EOS)  # fmt: skip
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 2 for c in content)


def test_32_concurrent_clients_get_their_own_answers(client, ref):
    prompts = [f"Request {i} asks about {w}" for i, w in
               enumerate(("cats dogs rain snow kings maps ships bells " * 4).split())]  # fmt: skip
    want = {p: ref.complete(p, max_tokens=12, temperature=0).text for p in prompts}

    def ask(i_prompt):
        i, p = i_prompt
        if i % 2:
            s = client.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0,
                                          stream=True)  # fmt: skip
            return p, "".join(c.choices[0].text for c in s if c.choices)
        return p, client.completions.create(model=MODEL, prompt=p, max_tokens=12,
                                            temperature=0).choices[0].text  # fmt: skip

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(ask, enumerate(prompts)))
    assert len(answers) == 32
    assert [a for _, a in answers] == [want[p] for p, _ in answers]


BAD = [  # (raw body, status, what the message or param names)
    (b'{"model": "llama-f32", "prompt": "x"', 400, "JSON"),
    (b"[1, 2]", 400, None),
    (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": "ten"}), 400, "max_tokens"),
    (json.dumps({"model": MODEL, "prompt": "x", "temperature": 5}), 400, "temperature"),
    (json.dumps({"model": MODEL, "prompt": "x", "top_p": 0}), 400, "top_p"),
    (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 0}), 400, "max_tokens"),
    (json.dumps({"model": MODEL, "prompt": "x", "n": 2}), 400, "n"),
    (json.dumps({"model": MODEL, "prompt": "x", "logit_bias": {"99999": 1}}), 400, "logit_bias"),
    (json.dumps({"model": "gpt-4", "prompt": "x"}), 404, "model"),
    (json.dumps({"model": MODEL, "prompt": "word " * 1100}), 400, "context"),
    (json.dumps({"model": MODEL, "prompt": []}), 400, None),
    (json.dumps({"model": MODEL}), 400, "prompt"),
]


@pytest.mark.parametrize("body,status,hint", BAD)
def test_bad_request_then_success(server, client, body, status, hint):
    r = httpx.post(server.url + "/v1/completions", content=body, timeout=30,
                   headers={"Authorization": f"Bearer {KEY}",
                            "Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if hint:
        assert hint in (err["param"] or "") or hint in err["message"] or hint in (err["code"] or "")
    ok = client.completions.create(model=MODEL, prompt="ok", max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens == 2


def test_bad_chat_requests(server, client):
    for body in ({"model": MODEL, "messages": []},
                 {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
                 {"model": MODEL, "messages": [{"role": "user", "content": 3}]},
                 {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                  "top_logprobs": 2}):  # fmt: skip
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(**body)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    ok = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                        max_tokens=2)  # fmt: skip
    assert ok.usage.completion_tokens == 2


def test_api_key_required(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.get(server.url + "/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert httpx.get(server.url + "/health").status_code == 200  # probes need no key


def test_metrics(server, client):
    client.completions.create(model=MODEL, prompt="count me", max_tokens=3, temperature=0)
    m = server.metrics()
    assert m['forge_requests_total{endpoint="completions",status="200"}'] >= 1
    assert m['forge_requests_total{endpoint="completions",status="400"}'] >= 1
    assert m["forge_generated_tokens_total"] >= 3 and m["forge_prompt_tokens_total"] >= 3
    assert m["forge_time_to_first_token_seconds_count"] >= 1
    assert m["forge_time_per_output_token_seconds_count"] >= 2
    assert m["forge_queue_depth"] == 0 and m["forge_running_sequences"] == 0
    assert m["forge_kv_cache_usage_ratio"] == 0.0


# -- a one-sequence server: queue limits, disconnects, shutdown ---------------------------------
@pytest.fixture(scope="module")
def small_server(model_path, tmp_path_factory):
    srv = Server(model_path, tmp_path_factory.mktemp("small"), "--max-batch", "1",
                 "--max-queue", "1")  # fmt: skip
    yield srv
    srv.stop()


def _long(server, **kw):
    body = {"model": MODEL, "prompt": "Tell me everything", "max_tokens": 1000, "temperature": 1,
            "logit_bias": NO_EOS, **kw}  # fmt: skip
    return body


def _wait_for(server, key, value, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.metrics().get(key) == value:
            return True
        time.sleep(0.02)
    return False


def test_queue_full_answers_429(small_server):
    url = small_server.url + "/v1/completions"
    with httpx.Client(timeout=60) as a, ThreadPoolExecutor(1) as pool:
        with a.stream("POST", url, json=_long(small_server, stream=True)) as running:
            lines = running.iter_lines()  # (a dropped iterator would close the connection)
            next(lines)  # running: the one batch slot is taken
            waiting = pool.submit(httpx.post, url, json=_long(small_server, max_tokens=5),
                                  timeout=60)  # fmt: skip
            assert _wait_for(small_server, "forge_queue_depth", 1)
            r = httpx.post(url, json=_long(small_server))
            assert r.status_code == 429 and r.headers["Retry-After"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error"
        # closing the first stream cancelled it: the waiting request runs and completes
        assert waiting.result().json()["usage"]["completion_tokens"] == 5
    assert _wait_for(small_server, "forge_kv_cache_usage_ratio", 0.0)
    r = httpx.post(url, json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=30)
    assert r.status_code == 200


def test_disconnect_cancels_and_frees_blocks(small_server):
    url = small_server.url + "/v1/completions"
    before = small_server.metrics()["forge_cancelled_sequences"]
    with httpx.stream("POST", url, json=_long(small_server, stream=True), timeout=60) as r:
        lines = r.iter_lines()
        next(lines)
        assert small_server.metrics()["forge_kv_cache_usage_ratio"] > 0
        assert small_server.metrics()["forge_running_sequences"] == 1
    assert _wait_for(small_server, "forge_cancelled_sequences", before + 1)
    assert _wait_for(small_server, "forge_kv_cache_usage_ratio", 0.0)
    with pytest.raises(httpx.ReadTimeout):  # a non-streaming client that gives up
        httpx.post(url, json=_long(small_server), timeout=httpx.Timeout(30, read=0.3))
    assert _wait_for(small_server, "forge_cancelled_sequences", before + 2)
    assert _wait_for(small_server, "forge_kv_cache_usage_ratio", 0.0)
    generated = small_server.metrics()["forge_generated_tokens_total"]
    assert generated < 2 * 1000  # neither ran to max_tokens
    r = httpx.post(url, json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=30)
    assert r.status_code == 200


def test_sigterm_drains_running_requests(small_server):
    url = small_server.url + "/v1/completions"
    with httpx.stream("POST", url, json=_long(small_server, stream=True, max_tokens=300),
                      timeout=60) as r:  # fmt: skip
        it = r.iter_lines()
        lines = [next(it)]
        small_server.proc.terminate()
        lines += list(it)
    events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert lines[-1] == "data: [DONE]" or "data: [DONE]" in lines
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert small_server.proc.wait(30) == 0  # a drained server exits 0, not "killed by SIGTERM"
    assert "Application shutdown complete" in small_server.output()
