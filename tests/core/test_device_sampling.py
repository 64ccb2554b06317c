"""Device sampling without a device: the Philox generator against its published known answers, the
host reference of `DeviceSampling` against forge.sampling's own chain, which sequences a device may
sample (`SequenceState.device_pick`), the engine's and the scheduler's choice of path with a runner
that says it samples on the device, and the hip runner's sampling parameters on a fake runtime."""

from __future__ import annotations

import math
import queue
import warnings

import numpy as np
import pytest

from forge.backend import (
    DeviceSampling,
    Runner,
    SeqBatch,
    philox4x32,
    philox_uniform,
    sample_host,
)
from forge.errors import ForgeRuntimeError
from forge.sampling import SamplingParams, build_sampler
from forge.scheduler import Finished, Scheduler


def test_philox_known_answers():
    """Random123's known-answer vectors for philox4x32 with 10 rounds."""
    m = 0xFFFFFFFF
    assert philox4x32((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert philox4x32((m, m, m, m), (m, m)) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    pi = philox4x32((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0))
    assert pi == (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)
    assert philox_uniform(0, 0) == ((0x6627E8D5 >> 5) * 2**26 + (0xE169C58D >> 6)) / 2**53
    us = [philox_uniform(12345, c) for c in range(20000)]
    assert 0.0 <= min(us) and max(us) < 1.0
    assert abs(np.mean(us) - 0.5) < 0.01 and abs(np.var(us) - 1 / 12) < 0.005
    assert len({philox_uniform(1, 7), philox_uniform(2, 7), philox_uniform(1, 8)}) == 3


class _FixedRng:
    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
        dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
        dict(temperature=0.5, top_k=0, top_p=0.9, min_p=0.0),
        dict(temperature=1.3, top_k=7, top_p=1.0, min_p=0.2),
        dict(temperature=2.0, top_k=3000, top_p=0.5, min_p=0.0),
    ],
)
def test_host_reference_is_the_sampler_chain(params):
    """sample_host(row, pick) picks what forge.sampling's chain picks with the same uniform."""
    rng = np.random.default_rng()
    for trial in range(30):
        n = int(rng.integers(2, 9000))
        logits = (rng.standard_normal(n) * rng.uniform(0.3, 4)).astype(np.float32)
        sampler = build_sampler(SamplingParams(**params))
        pick = DeviceSampling(**params, key=int(rng.integers(2**63)), counter=trial)
        sampler.ctx.rng = _FixedRng(philox_uniform(pick.key, pick.counter))
        assert sample_host(logits, pick) == sampler.sample(logits)


def test_which_chains_the_device_may_sample(model):
    def pick(**kw):
        return model.start("Hello", max_tokens=4, **kw).device_pick()

    assert pick(temperature=0) == DeviceSampling()
    state = model.start("Hello", temperature=0.7, top_k=20, top_p=0.9, min_p=0.1, seed=42)
    p = state.device_pick()
    assert p == DeviceSampling(0.7, 20, 0.9, 0.1, key=42, counter=0)
    assert p.log_min_p == math.log(0.1)
    state.take(5)
    state.take(6)
    assert state.device_pick().counter == 2  # the index of the token being picked
    plain = pick(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1)
    assert plain == DeviceSampling(1.0, 0, 1.0, 0.0, key=1)
    # the key is the seed, else one draw from the context's generator, kept for the sequence
    free = model.start("Hello", temperature=0.7)
    assert free.device_pick().key == free.device_pick().key
    p = pick(temperature=0.7, top_p=0.8, chain=["top_p", "temperature"])
    assert (p.top_k, p.top_p, p.min_p, p.temperature) == (0, 0.8, 0.0, 0.7)
    # the host keeps what a device cannot do
    assert pick(temperature=0.7, repeat_penalty=1.1) is None
    assert pick(temperature=0.7, logit_bias={3: 1.0}) is None
    assert pick(temperature=0.7, logprobs=2) is None
    assert pick(temperature=0, logprobs=0) is None
    assert pick(temperature=0.7, chain=["temperature", "top_k", "dist"]) is None
    assert pick(temperature=0.7, chain=["top_k", "top_p", "greedy"]) is None


class DeviceSpy(Runner):
    """A runner that says it samples on the device: forward_sample picks with the host
    reference; every call is recorded."""

    samples_on_device = True

    def __init__(self, runner):
        self.runner, self.spec, self.calls = runner, runner.spec, []

    def allocate_kv(self, n_blocks, block_size):
        self.runner.allocate_kv(n_blocks, block_size)

    def forward(self, batch):
        self.calls.append(("forward", [b.output for b in batch]))
        return self.runner.forward(batch)

    def forward_argmax(self, batch):
        self.calls.append(("argmax", len(batch)))
        return self.runner.forward_argmax(batch)

    def forward_sample(self, batch, picks):
        self.calls.append(("sample", list(picks)))
        rows = self.runner.forward([SeqBatch(b.tokens, b.start, b.block_table,
                                             "last" if p is not None else "none")
                                    for b, p in zip(batch, picks)])  # fmt: skip
        return [None if p is None else sample_host(r[-1], p) for r, p in zip(rows, picks)]


@pytest.fixture(scope="module")
def model(golden_dir):
    from forge.api import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load(str(golden_dir / "models" / "llama-f32.gguf"), backend="cpu_simd", n_ctx=256)


@pytest.fixture
def spy(model, monkeypatch):
    s = DeviceSpy(model.runner)
    monkeypatch.setattr(model, "runner", s)
    return s


def test_engine_samples_on_the_device_when_it_can(model, spy):
    kw = dict(max_tokens=8, temperature=0.9, top_k=30, top_p=0.9, min_p=0.02, seed=5)
    out = model.complete("Once upon a time", **kw)
    kinds = [c[0] for c in spy.calls]
    assert kinds == ["sample"] * len(out.tokens)  # the first token too: no logits row copied
    assert [c[1][0].counter for c in spy.calls] == list(range(len(out.tokens)))
    assert {c[1][0].key for c in spy.calls} == {5}
    spy.calls.clear()
    assert model.complete("Once upon a time", **kw).tokens == out.tokens  # same seed, same ids
    assert model.complete("Once upon a time", **{**kw, "seed": 6}).tokens != out.tokens
    spy.calls.clear()
    greedy = model.complete("Once upon a time", max_tokens=6, temperature=0)
    assert [c[0] for c in spy.calls] == ["sample"] * len(greedy.tokens)  # argmax picks
    assert all(c[1] == [DeviceSampling()] for c in spy.calls)
    spy.calls.clear()
    model.complete("Once upon a time", max_tokens=4, temperature=0.9, repeat_penalty=1.2)
    assert {c[0] for c in spy.calls} == {"forward"}  # penalties keep the host path
    spy.calls.clear()
    model.complete("Once upon a time", max_tokens=3, temperature=0.9, logprobs=2)
    assert {c[0] for c in spy.calls} == {"forward"}


def test_engine_on_a_host_runner_is_unchanged(model):
    assert not model.runner.samples_on_device
    kw = dict(max_tokens=6, temperature=0.9, seed=3)
    assert model.complete("Hello", **kw).tokens == model.complete("Hello", **kw).tokens


def _drain(q):
    while not isinstance(q.get(timeout=30), Finished):
        pass


def test_scheduler_batches_device_picks(model, spy):
    sched = Scheduler(model, max_batch=4).start()
    try:
        qs = []
        for i, extra in enumerate([{}, {}, {"temperature": 0}]):
            kw = {"temperature": 0.8, "seed": i, **extra}
            state = model.start(f"Prompt {i}", max_tokens=6, **kw)
            q: queue.Queue = queue.Queue()
            sched.submit(state, q.put)
            qs.append(q)
        for q in qs:
            _drain(q)
        samples = [c for c in spy.calls if c[0] == "sample"]
        assert samples and not [c for c in spy.calls if c[0] == "forward"]
        spy.calls.clear()
        state = model.start("Prompt 9", max_tokens=4, temperature=0.8, repeat_penalty=1.3)
        q = queue.Queue()
        sched.submit(state, q.put)
        _drain(q)
        assert {c[0] for c in spy.calls} == {"forward"}  # the host path for a penalised chain
    finally:
        sched.stop(5)


def test_hip_runner_writes_sampling_parameters(golden_dir):
    from forge_hip.runner import HipRunner
    from forge_hip.step_meta import SAMPLE_FIELDS

    from forge.gguf import open_gguf
    from forge.models import build_spec
    from forge.plugins import get_plugin_manager
    from tests.support.fake_runtime import FakeRuntime

    gguf = open_gguf(str(golden_dir / "models" / "gemma3-q4_k_m.gguf"))
    rt = FakeRuntime()
    runner = HipRunner(build_spec(gguf), gguf, get_plugin_manager().kernels, runtime=rt)
    runner.plan.products.round_prefill = False  # float products: kernels named as the fake expects
    runner.allocate_kv(16, 16)
    pick = DeviceSampling(0.7, 40, 0.9, 0.05, key=2**63 + 12345, counter=77)
    batch = [SeqBatch(np.array([5], np.int32), 3, np.arange(2, dtype=np.int32)),
             SeqBatch(np.array([7], np.int32), 0, np.array([5], np.int32)),
             SeqBatch(np.array([9], np.int32), 4, np.array([6], np.int32))]  # fmt: skip
    assert runner.forward_sample(batch, [None, pick, DeviceSampling()]) == [None, 0, 0]
    names = [name for name, _, _ in rt.launches]
    attention = [n for n in names if n.startswith("attn_decode")]
    assert len(attention) == runner.spec.n_layer and "sample_rows" in names
    # decode steps: no prompt attention; RoPE and the cache write inside the attention launch
    # (attn_decode, or the tensor-core attn_decode_tc's fused form: the fake says sm_90)
    assert "attn_rows" not in names and "qk_rope_store" not in names
    f = {name: runner.meta.field(name) for name in SAMPLE_FIELDS}
    assert f["s_temp"][:3].view(np.float32).tolist() == [0.0, np.float32(0.7), 0.0]
    assert f["s_topk"][1] == 40 and f["s_ctr"][1] == 77
    top_p = np.array([f["s_topp0"][1], f["s_topp1"][1]], np.int32).view(np.float64)[0]
    lmp = np.array([f["s_lminp0"][1], f["s_lminp1"][1]], np.int32).view(np.float64)[0]
    key = np.array([f["s_key0"][1], f["s_key1"][1]], np.int32).view(np.uint64)[0]
    assert (top_p, lmp, int(key)) == (0.9, math.log(0.05), 2**63 + 12345)
    # a prefill piece gets its pick on its last row; the rows before take the argmax
    rt.launches.clear()
    long = SeqBatch(np.arange(1, 12, dtype=np.int32), 0, np.arange(8, 9, dtype=np.int32))
    assert runner.forward_sample([long], [pick]) == [0]
    assert f["s_temp"][10].view(np.float32) == np.float32(0.7)
    assert not f["s_temp"][:10].any()
    # 11 rows: the prefill path (qk_rope_store, then attn_rows up to plan.ATT_ROWS_MAX rows)
    assert {"qk_rope_store", "attn_rows", "sample_rows"} <= {n for n, _, _ in rt.launches}
    runner.close()


def test_token_masks_pack_and_apply_on_the_host():
    from forge.backend import pack_token_mask, unpack_token_mask

    rng = np.random.default_rng(3)
    for n in (1, 31, 32, 33, 535, 262144):
        allowed = rng.random(n) < 0.3
        packed = pack_token_mask(allowed)
        assert packed.dtype == np.uint32 and packed.size == -(-n // 32)
        np.testing.assert_array_equal(unpack_token_mask(packed, n), allowed)
        i = int(rng.integers(n))
        word, bit = divmod(i, 32)
        assert bool((int(packed[word]) >> bit) & 1) == allowed[i]
    logits = rng.standard_normal(100).astype(np.float32)
    allowed = np.zeros(100, bool)
    allowed[[5, 17, 60]] = True
    best = max((5, 17, 60), key=lambda i: logits[i])
    assert sample_host(logits, DeviceSampling(mask=pack_token_mask(allowed))) == best
    for c in range(20):
        pick = DeviceSampling(1.0, key=9, counter=c, mask=pack_token_mask(allowed))
        assert sample_host(logits, pick) in (5, 17, 60)
    with pytest.raises(ForgeRuntimeError, match="every token is masked"):
        sample_host(logits, DeviceSampling(mask=pack_token_mask(np.zeros(100, bool))))
