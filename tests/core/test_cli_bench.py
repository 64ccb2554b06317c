"""`forge bench` like llama-bench: comma lists make one test each, the model's facts in every
row (checked against the `gguf` package's own reader), and md, csv, json and jsonl output."""

from __future__ import annotations

import csv
import io
import json
import warnings

import gguf
import numpy as np
import pytest

import forge.api
from forge.backend import SeqBatch
from forge.cli import main


@pytest.fixture(autouse=True)
def clean_env(fresh_forge_env):
    warnings.simplefilter("ignore")


@pytest.fixture(scope="module")
def model_path(golden_dir):
    return str(golden_dir / "models" / "llama-q8_0.gguf")


def bench(capsys, model_path, *argv):
    code = main(["bench", model_path, "--backend", "cpu_simd", "-r", "1", "-t", "2", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_comma_lists_give_one_row_per_test_with_the_model_facts(capsys, model_path):
    rows = json.loads(bench(capsys, model_path, "-p", "8,16", "-n", "2,3", "-o", "json"))
    assert [r["test"] for r in rows] == ["pp8", "pp16", "tg2", "tg3"]
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [(8, 0), (16, 0), (0, 2), (0, 3)]
    reader = gguf.GGUFReader(model_path)
    params = sum(int(t.n_elements) for t in reader.tensors)
    size = sum(int(t.n_bytes) for t in reader.tensors)
    for r in rows:
        assert r["model_n_params"] == params and r["model_size"] == size
        assert r["model_type"] == "llama Q8_0" and r["backend"] == "cpu_simd"
        assert r["n_threads"] == 2 and r["device"] is None
        assert r["avg_ts"] > 0 and len(r["samples_ts"]) == 1


def test_md_csv_and_jsonl(capsys, model_path):
    md = bench(capsys, model_path, "-p", "8", "-n", "0").splitlines()
    assert [c.strip() for c in md[0].strip("|").split("|")] == [
        "model", "size", "params", "backend", "threads", "test", "t/s"]  # fmt: skip
    cells = [c.strip() for c in md[2].strip("|").split("|")]
    assert len(md) == 3 and cells[5] == "pp8" and " ± " in cells[6] and cells[2] == "1.45 M"
    table = list(csv.DictReader(io.StringIO(bench(capsys, model_path, "-p", "0", "-n", "2",
                                                  "-o", "csv"))))  # fmt: skip
    assert [(r["test"], r["n_gen"], r["backend"]) for r in table] == [("tg2", "2", "cpu_simd")]
    lines = bench(capsys, model_path, "-p", "4", "-n", "2", "-o", "jsonl").splitlines()
    assert [json.loads(line)["test"] for line in lines] == ["pp4", "tg2"]


@pytest.mark.parametrize("argv, words", [
    (["-p", "8,x"], "comma list of whole numbers"),
    (["-p", "-8"], "counts >= 0"),
    (["-p", "0", "-n", "0"], "nothing to measure"),
    (["-r", "0"], "repetitions"),
    (["-p", "9000", "-c", "512"], "raise -c/--ctx-size"),
])  # fmt: skip
def test_bad_lists_fail_before_loading(capsys, monkeypatch, model_path, argv, words):
    monkeypatch.setattr(forge.api, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    code = main(["bench", model_path, *argv])
    out, err = capsys.readouterr()
    assert code == 2 and words in err and out == ""


def test_depths_run_every_test_after_that_many_cached_tokens(capsys, model_path, monkeypatch):
    """-d 0,40: each test at both depths; the measured steps start at that position, after the
    cached tokens were fed in prefill chunks."""
    import forge.bench as fb

    starts = []
    real = fb._prefill

    def spy(model, table, ids, start, chunk, output="none"):
        starts.append((start, len(ids), output))
        return real(model, table, ids, start, chunk, output)

    monkeypatch.setattr(fb, "_prefill", spy)
    rows = json.loads(bench(capsys, model_path, "-p", "8", "-n", "2", "-d", "0,40", "-o", "json"))
    assert [r["test"] for r in rows] == ["pp8", "tg2", "pp8 @ d40", "tg2 @ d40"]
    assert [r["n_depth"] for r in rows] == [0, 0, 40, 40]
    assert (40, 8, "last") in starts  # the pp test after its 40 cached tokens
    # the cached tokens end with a returned row (a GPU runner's queue finished before the clock)
    assert (0, 40, "last") in starts and not [
        s for s in starts if s[:2] == (0, 40) and s[2] != "last"
    ]


def test_ubatch_sets_the_prompt_pieces_of_the_pp_tests(capsys, model_path, monkeypatch):
    """-ub 16: a 40-token pp test runs as passes of 16, 16 and 8 prompt tokens (the depth fill
    and tg tests keep the runner's piece); each row says its ubatch, by default the runner's."""
    import forge.bench as fb

    pieces = []
    real = fb.forward_in_chunks

    def spy(runner, table, ids, start, chunk, *rest):
        for out in real(runner, table, ids, start, chunk, *rest):
            pieces.append((start, chunk, len(ids)))
            yield out

    monkeypatch.setattr(fb, "forward_in_chunks", spy)
    rows = json.loads(bench(capsys, model_path, "-p", "40", "-n", "0", "-ub", "16", "-o", "json"))
    assert [r["n_ubatch"] for r in rows] == [16]
    assert set(pieces) == {(0, 16, 40)} and len(pieces) == 2 * 3  # warm-up run + timed run
    rows = json.loads(bench(capsys, model_path, "-p", "8", "-n", "0", "-o", "json"))
    assert [r["n_ubatch"] for r in rows] == [256]  # cpu_simd's prefill_chunk


@pytest.mark.parametrize("ub", ["0", "257"])
def test_ubatch_past_the_runners_piece_is_refused(capsys, model_path, ub):
    code = main(["bench", model_path, "--backend", "cpu_simd", "-p", "8", "-n", "0", "-ub", ub])
    out, err = capsys.readouterr()
    assert code == 2 and f"ubatch) of {ub} tokens" in err and "takes 1 to 256" in err
    assert out == ""


class _FeedingLog:
    """A runner that feeds its picks (as hip's): `start_sample` only records the step, which
    computes when collected, taking its token from the step it feeds from. Logs each step's
    position and token source, and every collect, in order."""

    feeds_picks = samples_on_device = True

    def __init__(self, runner):
        self.runner, self.log, self.tokens = runner, [], []
        self.forward = runner.forward  # (the depth fill)

    def forward_argmax(self, batch):
        self.log.append(("sync", batch[0].start))
        self.tokens.append(self.runner.forward_argmax(batch)[0])
        return self.tokens[-1:]

    def start_sample(self, batch, picks, feed=None, feed_from=None):
        (b,), fed = batch, feed is not None and feed[0] == 0
        self.log.append(("fed" if fed else "start", b.start))
        b = SeqBatch(b.tokens.copy(), b.start, b.block_table.copy(), b.output)
        done = []

        def collect():
            if not done:
                if fed:
                    b.tokens = np.array(feed_from(), np.int32)
                self.log.append(("collect", b.start))
                done.append(self.runner.forward_sample([b], picks))
                self.tokens.append(done[0][0])
            return done[0]

        return collect


def test_tg_steps_run_one_ahead_on_a_runner_that_feeds_its_picks(model_path):
    """The tg loop takes tokens as the engine does: step N+1 starts, fed from step N's pick,
    before step N is read; --tg-sync runs the same greedy tokens one step after the other."""
    from forge.bench import bench_decode

    model = forge.api.load(model_path, backend="cpu_simd", n_ctx=128)
    runner = model.runner = _FeedingLog(model.runner)
    ahead = bench_decode(model, 4, 1, depth=20)
    assert ahead.test == "tg4 @ d20"
    timed = runner.log[len(runner.log) // 2 :]  # (the warm-up run first, the same steps)
    assert timed == [
        ("start", 20),
        ("fed", 21),
        ("collect", 20),
        ("fed", 22),
        ("collect", 21),
        ("fed", 23),
        ("collect", 22),
        ("collect", 23),
    ]
    picked, runner.log, runner.tokens = runner.tokens, [], []
    sync = bench_decode(model, 4, 1, depth=20, sync=True)
    assert sync.test == "tg4 sync @ d20" and runner.log[4:] == [("sync", p) for p in range(20, 24)]
    assert runner.tokens == picked and len(set(picked[:4])) > 1
