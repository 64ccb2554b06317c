"""Tensor parallelism on the GPUs of this host (forge_hip.tp_runner): every golden model whose
heads allow the split, over 2 and 4 GPUs, against the same model on one GPU and against the
golden reference; a worker killed under a running model ends it with an error naming the rank;
`forge serve -tp 2` under 32 concurrent streams. Skipped where fewer GPUs exist."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

import forge
from forge.errors import UsageError
from forge.gguf import open_gguf
from forge.models import build_spec
from forge.sharding import ShardPlan
from forge.workers import WorkerFailed
from tests.support.golden_rules import BOUNDS, golden_model_files, logit_errors, weight_class

MODELS = golden_model_files()


def _gpus() -> int:
    from forge_hip import HipBackend

    return len(HipBackend().probe().devices)


def _splits(path, world: int) -> bool:
    gguf = open_gguf(path)
    try:
        ShardPlan.build(build_spec(gguf), gguf, world)
    except UsageError:
        return False
    return True


def _load(path, world: int = 1):
    return forge.load(str(path), backend="hip", n_ctx=256, config={"tensor_parallel": world})


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("model_file", MODELS or ["<golden data missing>"])
def test_split_model_matches_one_gpu(rt, world, model_file, golden_dir, synthetic_golden, report,
                                     monkeypatch):  # fmt: skip
    if _gpus() < world:
        pytest.skip(f"{world} GPUs needed, {_gpus()} here")
    path = golden_dir / "models" / model_file
    if not _splits(path, world):
        pytest.skip(f"{model_file}'s sizes do not split {world} ways")
    monkeypatch.setenv("FORGE_HIP_KV", "f32")  # the golden reference's cache
    one, split = _load(path), _load(path, world)
    try:
        worst = apart = 0.0
        for case in synthetic_golden[model_file]["cases"]:
            n, ids = len(case["tokens"]), case["tokens"] + case["greedy"]
            a, b = one.logits(ids), split.logits(ids)
            assert b.shape == a.shape
            worst = max(worst, logit_errors(b[:n], case["logits"])[0])
            apart = max(apart, float(np.abs(a - b).max()))
            # free-running greedy decode (graph-replayed steps with their collectives)
            want = one.complete(case["tokens"], max_tokens=8, temperature=0).tokens
            got = split.complete(case["tokens"], max_tokens=8, temperature=0).tokens
            assert got == want, case["prompt"]
    finally:
        split.runner.close()
        one.runner.close()
    report.append(f"tp {world} {model_file:22s} golden max {worst:.2e}  vs 1 GPU max {apart:.2e}")
    assert worst <= BOUNDS[weight_class(model_file)][0], worst


def test_a_killed_worker_ends_the_model_naming_its_rank(rt, golden_dir):
    if _gpus() < 2:
        pytest.skip("2 GPUs needed")
    model = _load(golden_dir / "models" / "llama-q8_0.gguf", 2)
    group = model.runner.group
    try:
        assert len(model.complete([1, 2, 3], max_tokens=4, temperature=0).tokens) == 4
        os.kill(group.processes[1].pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerFailed, match="rank 1 died: killed by SIGKILL"):
            model.complete([1, 2, 3], max_tokens=4, temperature=0)
        assert time.monotonic() - t0 < 10
        assert not any(p.is_alive() for p in group.processes)
    finally:
        model.runner.close()


def test_serve_split_over_two_gpus_under_32_streams(rt, golden_dir, tmp_path):
    if _gpus() < 2:
        pytest.skip("2 GPUs needed")
    from tests.support.server import Server

    path = golden_dir / "models" / "llama-q8_0.gguf"
    server = Server(path, tmp_path, "--backend", "hip", "-tp", "2")
    try:
        body = {"model": "llama-q8_0", "max_tokens": 16, "temperature": 0}
        one = _load(path)
        try:
            prompts = [f"The {i} quick foxes" for i in range(32)]
            want = [one.complete(p, max_tokens=16, temperature=0).text for p in prompts]
        finally:
            one.runner.close()

        def ask(p):
            r = httpx.post(server.url + "/v1/completions", json={**body, "prompt": p},
                           timeout=120)  # fmt: skip
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        with ThreadPoolExecutor(32) as pool:
            texts = list(pool.map(ask, prompts))
        # 32 rows at once run other product kernels than one row: the random-weight model's
        # near ties may go the other way (measured: 1 of 32 streams, after 8 equal characters)
        same = sum(t == w for t, w in zip(texts, want))
        assert same >= 30, [(t, w) for t, w in zip(texts, want) if t != w]
        assert all(os.path.commonprefix([t, w]) for t, w in zip(texts, want))
    finally:
        server.stop()
