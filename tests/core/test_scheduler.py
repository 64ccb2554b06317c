"""The continuous-batching scheduler on a tiny golden model (llama-f32: float32 weights, so no
8-bit activation rounding amplifies batch-size-dependent summation order into argmax flips).

The reference for every batched result is the engine's single-sequence path, `Model.complete`.
"""

from __future__ import annotations

import queue
import threading
import time
import warnings

import numpy as np
import pytest

from forge.backend import SeqBatch
from forge.errors import ForgeRuntimeError
from forge.scheduler import Finished, QueueFullError, Scheduler, ShuttingDownError

MODEL = "llama-f32.gguf"
NO_EOS = {2: float("-inf")}  # llama-f32's EOS id: keeps generations running to max_tokens
PROMPTS = [f"Prompt {i}: the {w} said" for i, w in enumerate(
    ["cat", "dog", "bird", "fish", "king", "robot", "tree", "river"])]  # fmt: skip


def _load(golden_dir, n_ctx):
    from forge.api import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # plugins other engineers are still writing
        return load(str(golden_dir / "models" / MODEL), backend="cpu_simd", n_ctx=n_ctx)


@pytest.fixture(scope="module")
def model(golden_dir):
    return _load(golden_dir, 512)


def _submit(sched, model, prompt, **kw):
    q: queue.Queue = queue.Queue()
    kw.setdefault("temperature", 0)
    state = model.start(prompt, max_tokens=kw.pop("max_tokens", 20), **kw)
    return sched.submit(state, q.put), q, state


def _drain(q, timeout=30):
    events = []
    while True:
        msg = q.get(timeout=timeout)
        if isinstance(msg, Finished):
            return events, msg
        events.append(msg)


def test_batched_greedy_equals_single(model):
    single = {p: model.complete(p, max_tokens=20, temperature=0) for p in PROMPTS}
    sched = Scheduler(model, max_batch=8).start()
    try:
        alone = _submit(sched, model, PROMPTS[3])
        _, done = _drain(alone[1])
        together = [_submit(sched, model, p) for p in PROMPTS]
        results = [_drain(q) + (state,) for _, q, state in together]
    finally:
        sched.stop(5)
    assert alone[2].generated == single[PROMPTS[3]].tokens
    assert done.finish_reason == single[PROMPTS[3]].finish_reason
    for p, (events, fin, state) in zip(PROMPTS, results):
        ref = single[p]
        assert state.generated == ref.tokens, p
        assert "".join(e.text for e in events) == ref.text
        assert (fin.prompt_tokens, fin.completion_tokens) == (ref.prompt_tokens, len(ref.tokens))
        assert fin.finish_reason == ref.finish_reason
    assert model.allocator.usage == 0.0


def test_sampled_requests_are_seeded_and_independent(model):
    sched = Scheduler(model, max_batch=4).start()
    try:
        runs = []
        for _ in range(2):
            subs = [_submit(sched, model, p, temperature=0.9, seed=7) for p in PROMPTS[:4]]
            runs.append([(_drain(q), s.generated)[1] for _, q, s in subs])
    finally:
        sched.stop(5)
    assert runs[0] == runs[1]  # same seeds: same tokens whatever the batch composition
    assert len({tuple(r) for r in runs[0]}) > 1


class _Spy:
    """Wraps a runner and records each forward pass's batch (and can fail once)."""

    def __init__(self, runner, fail_once=False):
        self.runner, self.batches, self.fail_once = runner, [], fail_once

    def forward(self, batch):
        self.batches.append([(len(b.tokens), b.output) for b in batch])
        if self.fail_once:
            self.fail_once = False
            raise ForgeRuntimeError("injected failure")
        return self.runner.forward(batch)

    def forward_argmax(self, batch):
        self.batches.append([(len(b.tokens), b.output) for b in batch])
        return self.runner.forward_argmax(batch)

    def start_sample(self, batch, picks):
        self.batches.append([(len(b.tokens), b.output) for b in batch])
        return self.runner.start_sample(batch, picks)

    def prepare_batches(self, max_seqs):
        self.runner.prepare_batches(max_seqs)


def test_prefill_is_chunked_and_does_not_starve_decode(model, monkeypatch):
    spy = _Spy(model.runner)
    monkeypatch.setattr(model, "runner", spy)
    long_prompt = list(np.random.default_rng(0).integers(3, model.n_vocab, 300))
    sched = Scheduler(model, max_batch=4, prefill_chunk=64).start()
    try:
        _, q1, s1 = _submit(sched, model, PROMPTS[0], max_tokens=40, logit_bias=NO_EOS)
        q1.get(timeout=10)  # the first sequence is decoding
        spy.batches.clear()
        _, q2, s2 = _submit(sched, model, long_prompt, max_tokens=4)
        _drain(q1), _drain(q2)
    finally:
        sched.stop(5)
    prefill_steps = [b for b in spy.batches if any(n > 1 for n, _ in b)]
    assert len(prefill_steps) >= 300 // 64  # the long prompt took several steps
    for b in prefill_steps:
        assert sum(n for n, _ in b if n > 1) <= 64
        assert (1, "last") in b  # the decoder ran alongside
    assert s2.generated == model.complete(long_prompt, max_tokens=4, temperature=0).tokens


def test_prompt_pieces_default_to_the_models(model, monkeypatch):
    """Without `prefill_chunk` a step takes the model's piece (its runner's `prefill_chunk`):
    a 100-token prompt runs as 24 + 24 + 24 + 24 + 4 on a model whose runner takes 24."""
    spy = _Spy(model.runner)
    monkeypatch.setattr(model, "runner", spy)
    monkeypatch.setattr(model, "prefill_chunk", 24)
    prompt = [int(t) for t in np.random.default_rng(4).integers(3, model.n_vocab, 100)]
    sched = Scheduler(model, max_batch=2).start()
    try:
        _, q, state = _submit(sched, model, prompt, max_tokens=3)
        _, fin = _drain(q)
    finally:
        sched.stop(5)
    assert fin.finish_reason == "length"
    assert [n for b in spy.batches for n, _ in b if n > 1] == [24, 24, 24, 24, 4]
    assert state.generated == model.complete(prompt, max_tokens=3, temperature=0).tokens


def test_prompt_pieces_leave_room_for_decode_rows_in_one_pass(model, monkeypatch):
    """A runner whose passes take at most 20 rows (`pass_rows`): while two sequences decode, a
    long prompt's pieces are 18 rows (the model's piece, 32, would make the runner cut the step
    in two); every step stays within 20 rows and the results are the single-sequence ones."""
    spy = _Spy(model.runner)
    spy.pass_rows = 20
    monkeypatch.setattr(model, "runner", spy)
    monkeypatch.setattr(model, "prefill_chunk", 32)
    prompt = [int(t) for t in np.random.default_rng(5).integers(3, model.n_vocab, 100)]
    sched = Scheduler(model, max_batch=4).start()
    try:
        decoders = [_submit(sched, model, p, max_tokens=40, logit_bias=NO_EOS) for p in PROMPTS[:2]]
        for _, q, _ in decoders:
            q.get(timeout=10)  # both decoding
        spy.batches.clear()
        _, q, state = _submit(sched, model, prompt, max_tokens=3)
        _drain(q)
        for _, dq, _ in decoders:
            _drain(dq)
    finally:
        sched.stop(5)
    assert all(sum(n for n, _ in b) <= 20 for b in spy.batches), spy.batches
    pieces = [n for b in spy.batches for n, _ in b if n > 1]
    assert sum(pieces) == 100 and pieces[0] == 18, pieces
    assert state.generated == model.complete(prompt, max_tokens=3, temperature=0).tokens


def test_decode_rows_filling_the_pass_leave_prompts_a_token_a_step(model, monkeypatch):
    """pass_rows 2 with two sequences decoding: a 6-token prompt still moves, a token a step;
    each of those steps counts as a prompt step (5 of them; its last token gives the first
    output, as a decode row does)."""
    spy = _Spy(model.runner)
    spy.pass_rows = 2
    monkeypatch.setattr(model, "runner", spy)
    prompt = [int(t) for t in np.random.default_rng(6).integers(3, model.n_vocab, 6)]
    sched = Scheduler(model, max_batch=4).start()
    try:
        decoders = [_submit(sched, model, p, max_tokens=40, logit_bias=NO_EOS) for p in PROMPTS[:2]]
        for _, q, _ in decoders:
            q.get(timeout=10)
        before = sched.stats()["prompt_steps"]
        spy.batches.clear()
        _, q, state = _submit(sched, model, prompt, max_tokens=2)
        _drain(q)
        after = sched.stats()["prompt_steps"]
        for _, dq, _ in decoders:
            _drain(dq)
    finally:
        sched.stop(5)
    assert after - before == 5
    assert state.generated == model.complete(prompt, max_tokens=2, temperature=0).tokens


def test_a_prompt_piece_past_the_models_is_refused(model):
    with pytest.raises(ValueError, match="past the model's"):
        Scheduler(model, prefill_chunk=model.prefill_chunk + 1)


def test_preemption_when_kv_runs_out_keeps_results(golden_dir):
    small = _load(golden_dir, 96)  # 6 blocks of 16 positions for everyone
    refs = [small.complete(p, max_tokens=50, temperature=0).tokens for p in PROMPTS[:3]]
    sched = Scheduler(small, max_batch=3).start()
    try:
        subs = [_submit(sched, small, p, max_tokens=50) for p in PROMPTS[:3]]
        for _, q, _ in subs:
            _drain(q)
    finally:
        sched.stop(5)
    assert sched.preemptions > 0
    assert [s.generated for _, _, s in subs] == refs
    assert small.allocator.usage == 0.0


def test_cancel_frees_blocks(model):
    sched = Scheduler(model, max_batch=2).start()
    try:
        handle, q, state = _submit(sched, model, PROMPTS[1], max_tokens=400, logit_bias=NO_EOS)
        q.get(timeout=10)
        assert model.allocator.usage > 0
        handle.cancel()
        _, fin = _drain(q)
    finally:
        sched.stop(5)
    assert fin.finish_reason == "cancelled" and len(state.generated) < 400
    assert model.allocator.usage == 0.0 and sched.stats()["cancelled"] == 1


def test_queue_full_and_drain(model):
    sched = Scheduler(model, max_batch=1, max_queue=2)  # not started: nothing leaves the queue
    subs = [_submit(sched, model, p) for p in PROMPTS[:2]]
    with pytest.raises(QueueFullError):
        _submit(sched, model, PROMPTS[2])
    assert sched.stats()["waiting"] == 2
    sched.drain()
    with pytest.raises(ShuttingDownError):
        _submit(sched, model, PROMPTS[3])
    sched.start()
    assert sched.stop(30)  # accepted requests still complete
    for _, q, state in subs:
        assert _drain(q)[1].finish_reason == "length" and len(state.generated) == 20


def test_failed_forward_ends_its_batch_and_keeps_serving(model, monkeypatch):
    monkeypatch.setattr(model, "runner", _Spy(model.runner, fail_once=True))
    sched = Scheduler(model).start()
    try:
        _, q, _ = _submit(sched, model, PROMPTS[0], temperature=0.5)
        _, fin = _drain(q)
        assert fin.finish_reason == "error" and "injected failure" in fin.error
        _, q, state = _submit(sched, model, PROMPTS[0], temperature=0.5, seed=1)
        assert _drain(q)[1].finish_reason == "length" and len(state.generated) == 20
    finally:
        sched.stop(5)
    assert model.allocator.usage == 0.0


def test_callback_from_many_threads(model):
    """submit() and cancel() from several threads at once lose no request."""
    sched = Scheduler(model, max_batch=4, max_queue=64).start()
    results, lock = [], threading.Lock()

    def client(i):
        _, q, _ = _submit(sched, model, PROMPTS[i % 8], max_tokens=5)
        with lock:
            results.append(_drain(q)[1].finish_reason)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    sched.stop(5)
    assert sorted(results) == ["length"] * 16


class _Deferring:
    """A runner whose `start_sample` returns before computing, as a GPU's does: the pass runs
    when its tokens are collected. Logs "start", "collect" and (through `log_take`) each token
    the scheduler hands out, in order."""

    samples_on_device = True

    def __init__(self, runner, log):
        self.runner, self.log = runner, log

    def forward(self, batch):
        return self.runner.forward(batch)

    def forward_argmax(self, batch):
        return self.runner.forward_argmax(batch)

    def forward_sample(self, batch, picks):
        return self.runner.forward_sample(batch, picks)

    def prepare_batches(self, max_seqs):
        self.log.append(f"prepare {max_seqs}")

    def start_sample(self, batch, picks):
        self.log.append("start")
        batch = [SeqBatch(b.tokens.copy(), b.start, b.block_table.copy(), b.output) for b in batch]

        def collect():
            self.log.append("collect")
            return self.runner.forward_sample(batch, picks)

        return collect


class _Feeding(_Deferring):
    """A `_Deferring` runner that also `feeds_picks`: a fed sequence's token is the previous
    started step's pick, read only when this step computes (logged as "start fed")."""

    feeds_picks = True

    def __init__(self, runner, log):
        super().__init__(runner, log)
        self.fed_rows = 0

    def start_sample(self, batch, picks, feed=None, feed_from=None):
        fed = [(i, f) for i, f in enumerate(feed or ()) if f >= 0]
        self.log.append("start fed" if fed else "start")
        self.fed_rows += len(fed)
        batch = [SeqBatch(b.tokens.copy(), b.start, b.block_table.copy(), b.output) for b in batch]
        assert not fed or feed_from is not None
        previous, done = feed_from, []

        def collect():
            if not done:
                if fed:
                    picked = previous()
                    for i, f in fed:
                        assert picked[f] is not None and len(batch[i].tokens) == 1
                        batch[i].tokens = np.array([picked[f]], np.int32)
                self.log.append("collect")
                done.append(self.runner.forward_sample(batch, picks))
            return done[0]

        return collect


def _run_logged(model, sched, log):
    """PROMPTS[2] for 4 greedy tokens on a started scheduler, which is stopped after; the log
    is cleared first, then gets "take" / "finished" for each message, in order. Returns the
    state and its TokenEvents."""
    log.clear()
    q: queue.Queue = queue.Queue()

    def on_event(message):  # called on the scheduler thread: the log's order is exact
        log.append("finished" if isinstance(message, Finished) else "take")
        q.put(message)

    try:
        state = model.start(PROMPTS[2], max_tokens=4, temperature=0)
        sched.submit(state, on_event)
        events, _ = _drain(q)
    finally:
        sched.stop(5)
    return state, events


def test_host_work_overlaps_the_next_step(model, monkeypatch):
    """Step N+1 starts before step N's token is taken; a sequence that certainly ends
    (max_tokens) is left out of the next step; the tokens equal the single-sequence path's."""
    log: list[str] = []
    monkeypatch.setattr(model, "runner", _Deferring(model.runner, log))
    ref = model.complete(PROMPTS[2], max_tokens=4, temperature=0)
    assert len(ref.tokens) == 4  # no end-of-generation token before max_tokens
    log.clear()  # (complete runs the same steps on this thread)
    sched = Scheduler(model, max_batch=5).start()
    assert log == ["prepare 5"]  # the runner got ready before the first step
    state, events = _run_logged(model, sched, log)
    assert state.generated == ref.tokens and len(events) == 4
    assert log == ["start", "collect"] + ["start", "take", "collect"] * 3 + ["take", "finished"]
    assert sched.steps == 4  # the prompt, then 3 of the 4 tokens fed (the 4th ends it)
    assert sched.stats()["prompt_steps"] == 1


def test_a_feeding_runner_starts_each_step_before_the_last_is_read(model, monkeypatch):
    """With a runner that feeds picks, step N+1 starts (its token fed from step N's pick)
    before step N is collected; the tokens equal the single-sequence path's."""
    ref = model.complete(PROMPTS[2], max_tokens=4, temperature=0)
    log: list[str] = []
    runner = _Feeding(model.runner, log)
    monkeypatch.setattr(model, "runner", runner)
    sched = Scheduler(model, max_batch=5).start()
    state, events = _run_logged(model, sched, log)
    assert state.generated == ref.tokens and len(events) == 4
    # the 4th token ends the sequence by count: no step is started ahead for it
    assert log == ["start"] + ["start fed", "collect", "take"] * 3 + ["collect", "take",
                                                                      "finished"]  # fmt: skip
    assert sched.steps == 4 and runner.fed_rows == 3


@pytest.mark.parametrize("runner_class", [_Deferring, _Feeding])
def test_stop_strings_end_batched_sequences_like_single_ones(model, monkeypatch, runner_class):
    """A stop string found while the next step runs drops that sequence's row of it; every
    sequence still gets the single-sequence text, tokens and finish reason."""
    monkeypatch.setattr(model, "runner", runner_class(model.runner, []))
    full = {p: model.complete(p, max_tokens=24, temperature=0).text for p in PROMPTS}
    stops = {p: [t[len(t) // 2 : len(t) // 2 + 3]] if len(t) > 8 else [] for p, t in full.items()}
    refs = {p: model.complete(p, max_tokens=24, temperature=0, stop=stops[p]) for p in PROMPTS}
    assert sum(r.finish_reason == "stop" for r in refs.values()) >= 4
    sched = Scheduler(model, max_batch=8).start()
    try:
        subs = [_submit(sched, model, p, max_tokens=24, stop=stops[p]) for p in PROMPTS]
        results = [_drain(q) for _, q, _ in subs]
    finally:
        sched.stop(5)
    for p, (events, fin), (_, _, state) in zip(PROMPTS, results, subs):
        ref = refs[p]
        assert "".join(e.text for e in events) == ref.text, p
        assert state.generated == ref.tokens and fin.finish_reason == ref.finish_reason, p
    assert model.allocator.usage == 0.0
    assert getattr(model.runner, "fed_rows", 1) > 0  # a _Feeding runner did feed


@pytest.mark.parametrize("runner_class", [_Deferring, _Feeding])
def test_seeded_device_sampling_overlapped_equals_single(model, monkeypatch, runner_class):
    """While a step runs the next token's draw counter is one ahead of the taken tokens: the
    overlapped scheduler draws exactly what the one-sequence engine draws."""
    monkeypatch.setattr(model, "runner", runner_class(model.runner, []))
    kw = dict(max_tokens=12, temperature=0.9, top_k=40)
    refs = [model.complete(p, seed=11 + i, **kw).tokens for i, p in enumerate(PROMPTS[:4])]
    sched = Scheduler(model, max_batch=4).start()
    try:
        subs = [_submit(sched, model, p, seed=11 + i, **kw) for i, p in enumerate(PROMPTS[:4])]
        for _, q, _ in subs:
            _drain(q)
    finally:
        sched.stop(5)
    assert [s.generated for _, _, s in subs] == refs
    assert len({tuple(r) for r in refs}) == 4


@pytest.mark.parametrize("runner_class", [_Deferring, _Feeding])
def test_sampled_rows_after_a_prompt_chunk_get_their_own_tokens(model, monkeypatch, runner_class):
    """A batch [decoding, prompt chunk without output, one-token prompt]: each sampled row's
    token goes to its own sequence (the runner returns one entry per batch row)."""
    monkeypatch.setattr(model, "runner", runner_class(model.runner, []))
    long_prompt = [int(t) for t in np.random.default_rng(2).integers(3, model.n_vocab, 100)]
    one = [int(model.tokenize("cat", add_special=False)[0])]
    prompts = [PROMPTS[0], long_prompt, one]
    refs = [model.complete(p, max_tokens=6, temperature=0).tokens for p in prompts]
    sched = Scheduler(model, max_batch=4, prefill_chunk=40)  # the first step holds all three
    subs = [_submit(sched, model, p, max_tokens=6) for p in prompts]
    sched.start()
    try:
        results = [_drain(q)[1] for _, q, _ in subs]
    finally:
        sched.stop(5)
    assert [r.finish_reason for r in results] != ["error"] * 3, results[0].error
    assert [s.generated for _, _, s in subs] == refs
    assert getattr(model.runner, "fed_rows", 1) > 0


def test_a_stop_string_taken_before_a_host_sampled_step_ends_its_sequence_once(model, monkeypatch):
    """Greedy A's tokens are picked by the runner; B (logprobs: sampled on the host) finishes
    its prompt in the step that takes the token completing A's stop string. A ends there with
    exactly the single-sequence text and one Finished; B is unaffected."""
    monkeypatch.setattr(model, "runner", _Deferring(model.runner, []))
    full = model.complete(PROMPTS[1], max_tokens=12, temperature=0)
    stop = full.text[len(full.text) // 2 :][:2]
    ref_a = model.complete(PROMPTS[1], max_tokens=12, temperature=0, stop=[stop])
    k = len(ref_a.tokens)  # taking A's k-th token finds the stop string
    assert ref_a.finish_reason == "stop" and 1 < k < 12
    n_a = len(model.tokenize(PROMPTS[1]))
    chunk = 16
    # B's last prompt chunk rides in step k + 1, the step whose start takes A's k-th token
    b_len = (chunk - n_a) + chunk * (k - 1) + 5
    b_prompt = [int(t) for t in np.random.default_rng(3).integers(3, model.n_vocab, b_len)]
    ref_b = model.complete(b_prompt, max_tokens=3, temperature=0, logprobs=0)
    sched = Scheduler(model, max_batch=4, prefill_chunk=chunk)
    _, qa, sa = _submit(sched, model, PROMPTS[1], max_tokens=12, stop=[stop])
    _, qb, sb = _submit(sched, model, b_prompt, max_tokens=3, logprobs=0)
    sched.start()
    try:
        events_a, fin_a = _drain(qa)
        events_b, fin_b = _drain(qb)
        time.sleep(0.2)
        assert qa.empty()  # one Finished, nothing after it
    finally:
        sched.stop(5)
    assert "".join(e.text for e in events_a) == ref_a.text and fin_a.finish_reason == "stop"
    assert sa.generated == ref_a.tokens and sb.generated == ref_b.tokens
    assert all(e.logprob is not None for e in events_b)  # logprobs=0: the chosen token's


@pytest.mark.parametrize("kw", [dict(temperature=0), dict(temperature=0.9, top_k=40, seed=5)])
def test_generate_runs_one_step_ahead_on_a_feeding_runner(model, monkeypatch, kw):
    """Model.generate on a runner that feeds picks starts each decode step before reading the
    last one's token, and gives the tokens, text and finish reason of a runner that picks on
    the device step by step: max_tokens, and a stop string (found one step late: that step is
    dropped)."""
    plain = model.runner
    monkeypatch.setattr(model, "runner", _Deferring(plain, []))
    refs = [model.complete(p, max_tokens=16, **kw) for p in PROMPTS[:3]]
    text = refs[0].text
    stop = [text[len(text) // 2 : len(text) // 2 + 3]]
    stopped = model.complete(PROMPTS[0], max_tokens=16, stop=stop, **kw)
    assert stopped.finish_reason == "stop" and len(stopped.tokens) < 16
    runner = _Feeding(plain, [])
    monkeypatch.setattr(model, "runner", runner)
    for p, ref in zip(PROMPTS, refs):
        got = model.complete(p, max_tokens=16, **kw)
        assert (got.tokens, got.text, got.finish_reason) == (ref.tokens, ref.text,
                                                             ref.finish_reason), p  # fmt: skip
    assert runner.fed_rows == sum(len(r.tokens) - 1 for r in refs)  # all but the prefill's
    got = model.complete(PROMPTS[0], max_tokens=16, stop=stop, **kw)
    assert (got.tokens, got.text, got.finish_reason) == (stopped.tokens, stopped.text, "stop")


def test_generators_interleaved_on_a_feeding_runner_keep_their_own_tokens(model, monkeypatch):
    """Two generations advanced in turn on one runner that feeds picks: each step is fed from
    its own sequence's last step (named by feed_from), never from the step the other one
    started in between."""
    plain = model.runner
    monkeypatch.setattr(model, "runner", _Deferring(plain, []))
    refs = [model.complete(p, max_tokens=12, temperature=0).text for p in PROMPTS[:2]]
    assert refs[0] != refs[1]
    runner = _Feeding(plain, [])
    monkeypatch.setattr(model, "runner", runner)
    texts = ["", ""]
    for a, b in zip(*(model.generate(p, max_tokens=12, temperature=0) for p in PROMPTS[:2])):
        texts[0] += a
        texts[1] += b
    assert runner.fed_rows > 0 and all(texts)
    for i, p in enumerate(PROMPTS[:2]):  # zip stops at the shorter: the rest of each, alone
        assert refs[i].startswith(texts[i]), p
