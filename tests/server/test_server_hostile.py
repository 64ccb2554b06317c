"""`forge serve` against hostile clients: a corpus of malformed requests (every one a 4xx with an
OpenAI error body, never a 500), bodies beyond the size cap (413 before they are read), the API
key checked before anything else (and kept out of `ps`), huge prompts and max_tokens, and a
model whose chat template never ends."""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import httpx
import pytest
from gguf import GGUFValueType as V

from tests.support.gguf_factory import rewrite_gguf
from tests.support.server import MODEL, N_CTX, Server

pytest.importorskip("fastapi")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

KEY = "hostile-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BODY = 64 * 1024
NO_EOS = {"2": -100}


@pytest.fixture(scope="module")
def model_path(golden_dir):
    return golden_dir / "models" / f"{MODEL}.gguf"


@pytest.fixture(scope="module")
def guarded(model_path, tmp_path_factory):
    """A server whose key comes from a file, with a 64 KiB body limit."""
    tmp = tmp_path_factory.mktemp("guarded")
    (tmp / "key").write_text(KEY + "\n")
    srv = Server(model_path, tmp, "--api-key-file", str(tmp / "key"), "--max-body-bytes",
                 str(MAX_BODY))  # fmt: skip
    srv.key = KEY
    yield srv
    srv.stop()


def _post(server, path, body, headers=AUTH, timeout=30):
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, timeout=timeout,
                      headers={"Content-Type": "application/json", **headers})  # fmt: skip


def _raw(server, request: bytes, timeout: float = 20) -> tuple[int, dict]:
    """Send raw bytes, read until the server closes; (status, JSON body)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _is_openai_error(r: httpx.Response) -> bool:
    err = r.json().get("error")
    return isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}


# -- the request corpus ------------------------------------------------------------------------
def _corpus() -> list[tuple[str, str, object]]:
    """(label, path, body): ~110 malformed requests, each refused with a 4xx."""
    cmpl, chat = "/v1/completions", "/v1/chat/completions"
    ok_c = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    ok_m = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    raw = [b"", b"{", b'{"prompt": "x"', b'{"prompt": "x"} trailing', b"null", b"[]", b"1",
           b'"prompt"', b"\xff\xfe\x00", b'{"prompt": NaN}', b'{"prompt": "x", "prompt": 1}',
           b"[" * 100000 + b"]" * 100000, b'{"a":' * 5000 + b"1" + b"}" * 5000]  # fmt: skip
    cases: list[tuple[str, str, object]] = []
    for path in (cmpl, chat):
        cases += [(f"{path} raw {body[:12]!r}", path, body) for body in raw]
    fields = {
        "model": [3, ["x"], "gpt-4"],
        "prompt": [{"a": 1}, [[1, 2]], [1, "a"], [9223372036854775808], [-1], [2**31],
                   [1.5], [], ["a", "b"], [True], None],
        "max_tokens": ["ten", -1, 0, 1.5, True, [1]],
        "temperature": ["hot", -1, 3, [0]],
        "top_p": [0, 1.5, "x"], "top_k": [-1, "x", 1.5], "min_p": [-0.1, 2],
        "repeat_penalty": [0, -1], "presence_penalty": [3], "frequency_penalty": [-3],
        "seed": [-1, 2**64, "x"], "n": [0, 2, 10**20], "stop": [3, [1], {"a": "b"}],
        "logit_bias": [[1], {"x": 1}, {"\u00b2": 1}, {"1" * 5000: 1}, {"-1": 1}, {"1": "a"},
                       {"1": 1000}, {"99999999999999999999": 1}, {"1": None}],
        "logprobs": [-1, 21, "x"], "stream": ["yes", 1], "stream_options": [[1], "x"],
        "echo": [True], "best_of": [2, 0], "suffix": ["x", 3],
    }  # fmt: skip
    for field, values in fields.items():
        for value in values:
            cases.append((f"completions {field}={value!r:.30}", cmpl, {**ok_c, field: value}))
    chat_fields = {
        "messages": [None, [], "x", [{}], [{"role": "wizard", "content": "x"}],
                     [{"role": "user", "content": 3}], [{"role": "user", "content": [{"x": 1}]}],
                     [{"role": "user", "content": [{"type": "image", "text": "x"}]}],
                     [{"role": "user", "content": "x", "name": 3}], [["user", "x"]]],
        "tools": [[{"type": "function"}]], "top_logprobs": [2, 21, -1], "logprobs": ["x"],
        "max_completion_tokens": [0, "x"], "logit_bias": [{"\u00b2": 1}, {"1" * 5000: 1}],
    }  # fmt: skip
    for field, values in chat_fields.items():
        for value in values:
            cases.append((f"chat {field}={value!r:.30}", chat, {**ok_m, field: value}))
    cases.append(("chat top_logprobs without logprobs", chat, {**ok_m, "top_logprobs": 2}))
    return cases


CORPUS = _corpus()


def test_corpus_size():
    assert 100 <= len(CORPUS) <= 130


def _vm_hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))


def test_every_malformed_request_gets_a_4xx(guarded):
    peak_before = _vm_hwm_kib(guarded.proc.pid)
    failures = []
    for label, path, body in CORPUS:
        try:
            r = _post(guarded, path, body, timeout=30)
        except httpx.HTTPError as e:
            failures.append(f"{label}: {type(e).__name__}")
            continue
        if not 400 <= r.status_code < 500 or not _is_openai_error(r):
            failures.append(f"{label}: {r.status_code} {r.text[:120]}")
    assert not failures, "\n".join(failures)
    m = guarded.metrics()
    assert not any('status="500"' in k for k in m), m
    # the corpus did not grow the HTTP process's peak memory by more than a few bodies' worth
    assert _vm_hwm_kib(guarded.proc.pid) - peak_before < 100 * 1024
    r = _post(guarded, "/v1/completions", {"model": MODEL, "prompt": "ok", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_huge_integers_and_bad_bias_keys_are_400s_naming_the_problem(guarded):
    r = _post(guarded, "/v1/completions", {"model": MODEL, "prompt": [9223372036854775808]})
    assert r.status_code == 400 and "token ids" in r.json()["error"]["message"]
    for key in ("\u00b2", "1" * 5000):
        r = _post(guarded, "/v1/completions", {"model": MODEL, "prompt": "x",
                                               "logit_bias": {key: 1}})  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"


# -- authentication first, body limits -----------------------------------------------------------
def test_bad_json_without_the_key_is_401_not_400(guarded):
    r = _post(guarded, "/v1/completions", b"{not json", headers={})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = _post(guarded, "/v1/completions", b"{not json")
    assert r.status_code == 400


def test_unauthenticated_large_body_is_refused_before_it_is_read(guarded):
    """The headers announce 50 MB and no byte of it is sent: an answer means it was not read."""
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 50000000\r\n\r\n")  # fmt: skip
    status, body = _raw(guarded, head)
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, body = _raw(guarded, head.replace(b"\r\n\r\n", f"\r\n{_auth_line()}\r\n\r\n".encode()))
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert str(MAX_BODY) in body["error"]["message"]


def _auth_line() -> str:
    return f"Authorization: Bearer {KEY}"


def test_chunked_body_beyond_the_limit_is_413(guarded):
    def chunks():
        for _ in range(2 * MAX_BODY // 4096 + 1):
            yield b"x" * 4096

    r = httpx.post(guarded.url + "/v1/completions", content=chunks(), headers=AUTH, timeout=30)
    assert r.status_code == 413 and _is_openai_error(r)
    body = {"model": MODEL, "prompt": "y" * (MAX_BODY - 200), "max_tokens": 1}
    assert _post(guarded, "/v1/completions", body).status_code != 413  # just under the limit


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/metrics", "/v1/models"])
def test_everything_but_the_probes_needs_the_key(guarded, path):
    assert httpx.get(guarded.url + path, timeout=10).status_code == 401
    assert httpx.get(guarded.url + path, headers=AUTH, timeout=10).status_code == 200
    for probe in ("/health", "/ready"):
        assert httpx.get(guarded.url + probe, timeout=10).status_code == 200


def test_the_key_is_not_on_the_command_line(guarded):
    with open(f"/proc/{guarded.proc.pid}/cmdline", "rb") as f:
        assert KEY.encode() not in f.read()


def test_metrics_can_be_public_and_exposed_hosts_are_warned_about(model_path, tmp_path):
    srv = Server(model_path, tmp_path, "--host", "0.0.0.0",
                 env={"FORGE_SERVER_METRICS_PUBLIC": "1"})  # fmt: skip
    try:
        assert "without an API key" in srv.output()
        assert httpx.get(srv.url + "/metrics", timeout=10).status_code == 200
    finally:
        srv.stop()
    srv = Server(model_path, tmp_path, env={"FORGE_API_KEY": KEY, "FORGE_SERVER_METRICS_PUBLIC":
                                            "true"})  # fmt: skip
    try:
        assert httpx.get(srv.url + "/metrics", timeout=10).status_code == 200
        assert httpx.get(srv.url + "/v1/models", timeout=10).status_code == 401
        assert "without an API key" not in srv.output()
    finally:
        srv.stop()


# -- prompts and max_tokens beyond the context -----------------------------------------------------
def test_a_prompt_that_cannot_fit_is_refused_without_tokenizing(guarded):
    body = {"model": MODEL, "prompt": "word " * 12000, "max_tokens": 1}  # 60 KB, < the limit
    r = _post(guarded, "/v1/completions", body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "at least" in r.json()["error"]["message"]


def test_max_tokens_far_beyond_the_context_is_clamped(guarded):
    body = {"model": MODEL, "prompt": "Hello there", "max_tokens": 10**12, "temperature": 1,
            "logit_bias": NO_EOS}  # fmt: skip
    r = _post(guarded, "/v1/completions", body, timeout=120)
    assert r.status_code == 200, r.text
    usage, choice = r.json()["usage"], r.json()["choices"][0]
    room = N_CTX - usage["prompt_tokens"]
    assert usage["max_tokens_clamped_to"] == room
    assert usage["completion_tokens"] == room and choice["finish_reason"] == "length"
    # a max_tokens that fits says nothing
    r = _post(guarded, "/v1/completions", {**body, "max_tokens": 3})
    assert "max_tokens_clamped_to" not in r.json()["usage"]


# -- a chat template that never ends -------------------------------------------------------------
NESTED_LOOPS = ("{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}"
                "{% endfor %}{% endfor %}")  # fmt: skip


def _cpu_seconds(pid: int) -> float:
    """CPU time of `pid` and its living descendants."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return total


def test_a_hostile_chat_template_is_a_400_and_leaves_nothing_running(model_path, tmp_path):
    path = rewrite_gguf(
        model_path,
        tmp_path / "hostile-template.gguf",
        set_kv=[("tokenizer.chat_template", NESTED_LOOPS, V.STRING, None)],
    )
    srv = Server(path, tmp_path)
    try:
        started = time.monotonic()
        r = _post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]},
                  headers={})  # fmt: skip
        assert r.status_code == 400 and _is_openai_error(r)
        assert "did not finish rendering within 1 s" in r.json()["error"]["message"]
        assert time.monotonic() - started < 30
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        # no thread or process kept spinning on the template: the server tree is idle
        before = _cpu_seconds(srv.proc.pid)
        time.sleep(1.0)
        assert _cpu_seconds(srv.proc.pid) - before < 0.5
        r = _post(srv, "/v1/completions", {"prompt": "x", "max_tokens": 2}, headers={})
        assert r.status_code == 200
    finally:
        srv.stop()
