"""A request's text does not depend on what else the server runs: `forge serve` on the default
model (cpu_simd, `batch_invariant = true`), driven by the official `openai` client, answers four
greedy prompts and one seeded sampled prompt the same alone and among 16 concurrent requests."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")

from tests.support.server import Server  # noqa: E402

PROMPTS = [f"Count from {i} to {i + 5}:" for i in range(4)]
FILLERS = [f"Write a short line about the number {i}." for i in range(11)]
SEEDED = {"prompt": "Tell me a story about a lighthouse.", "temperature": 0.9, "seed": 1234}


@pytest.fixture(scope="module")
def client(default_model_path, tmp_path_factory):
    srv = Server(default_model_path, tmp_path_factory.mktemp("inv"), "--max-batch", "16",
                 env={"FORGE_BATCH_INVARIANT": "true"})  # fmt: skip
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    srv.stop()


def _complete(client, prompt: str, max_tokens: int = 6, **sampling) -> str:
    sampling.setdefault("temperature", 0)
    model = client.models.list().data[0].id
    done = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                     **sampling)  # fmt: skip
    return done.choices[0].text


def test_texts_alone_equal_texts_among_concurrent_requests(client):
    alone = [_complete(client, p) for p in PROMPTS]
    seeded_alone = _complete(client, SEEDED["prompt"], 12, temperature=0.9, seed=1234)
    jobs = [(p, 6, {}) for p in PROMPTS] + [(p, 10, {}) for p in FILLERS]
    jobs.insert(7, (SEEDED["prompt"], 12, {"temperature": 0.9, "seed": 1234}))
    with ThreadPoolExecutor(len(jobs)) as pool:  # 16 at once
        texts = list(pool.map(lambda j: _complete(client, j[0], j[1], **j[2]), jobs))
    together = [texts[jobs.index((p, 6, {}))] for p in PROMPTS]
    assert together == alone
    assert texts[7] == seeded_alone
