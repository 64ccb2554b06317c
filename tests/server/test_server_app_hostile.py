"""The app in-process (Starlette's TestClient): where request work runs (off the event loop), 500s
counted in /metrics, and the API key settings."""

from __future__ import annotations

import asyncio
import warnings

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from forge.config import ServerConfig  # noqa: E402
from forge.errors import ConfigError  # noqa: E402
from forge.server import create_app  # noqa: E402
from forge.server.auth import is_loopback, resolve_api_key  # noqa: E402


@pytest.fixture(scope="module")
def model(golden_dir):
    from forge.api import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load(str(golden_dir / "models" / "llama-f32.gguf"), backend="cpu_simd", n_ctx=256)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def test_prompts_are_tokenized_off_the_event_loop(model, monkeypatch):
    seen = []
    start = type(model).start

    def spy_start(self, *args, **kwargs):
        seen.append(("start", _loop_running()))
        return start(self, *args, **kwargs)

    def spy_encode(text, *args, **kwargs):
        seen.append(("encode", _loop_running()))
        return encode(text, *args, **kwargs)

    encode = model.tokenizer.encode
    monkeypatch.setattr(type(model), "start", spy_start)
    monkeypatch.setattr(model.tokenizer, "encode", spy_encode)
    with TestClient(create_app(model)) as client:
        r = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 1})
        assert r.status_code == 200
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user",
                                                                    "content": "Hi"}],
                                                      "max_tokens": 1})  # fmt: skip
        assert r.status_code == 200
    assert ("start", False) in seen and ("encode", False) in seen
    assert all(not on_loop for _, on_loop in seen), seen


def test_internal_errors_are_counted_in_metrics(model, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("a bug")

    app = create_app(model)
    with TestClient(app, raise_server_exceptions=False) as client:
        monkeypatch.setattr(type(model), "start", broken)
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        metrics = client.get("/metrics").text
    assert 'forge_requests_total{endpoint="completions",status="500"} 1.0' in metrics


def test_api_key_from_a_file(tmp_path, model):
    (tmp_path / "key").write_text("from-a-file\n")
    config = ServerConfig(api_key_file=str(tmp_path / "key"))
    assert resolve_api_key(config) == "from-a-file"
    with TestClient(create_app(model, config)) as client:
        assert client.get("/v1/models").status_code == 401
        ok = client.get("/v1/models", headers={"Authorization": "Bearer from-a-file"})
        assert ok.status_code == 200
    for bad in ("", "two\nlines\n"):
        (tmp_path / "key").write_text(bad)
        with pytest.raises(ConfigError, match="api_key_file"):
            resolve_api_key(config)
    with pytest.raises(ConfigError, match="cannot be read"):
        resolve_api_key(ServerConfig(api_key_file=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="not both"):
        resolve_api_key(ServerConfig(api_key="k", api_key_file=str(tmp_path / "key")))


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("localhost", True), ("::1", True), ("[::1]", True), ("127.8.0.1", True),
    ("0.0.0.0", False), ("::", False), ("192.168.1.4", False), ("example.com", False),
])  # fmt: skip
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback
