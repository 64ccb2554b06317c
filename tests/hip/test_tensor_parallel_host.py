"""A tensor-parallel rank's plan without a GPU (forge_hip.sharded_plan on the recording fake
runtime, a recording communicator): each rank places only its part of the weights, all-reduces
ws.o after every attention output and down product (inside the captured decode graph), and
gathers the head's logits before the pick; the worker group answers and fails as it must."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from forge.backend import SeqBatch
from forge.errors import UsageError
from forge.gguf import open_gguf
from forge.models import build_spec
from forge.plugins import get_plugin_manager
from forge.shard_view import ShardView, rank_spec
from forge.sharding import ShardPlan
from forge.workers import WorkerFailed, WorkerGroup, serve
from tests.support.fake_runtime import FakeRuntime


class RecordingComm:
    """Records collectives in the fake runtime's launch list, where they run among kernels."""

    def __init__(self, rt: FakeRuntime, rank: int, world: int):
        self.rt, self.rank, self.world = rt, rank, world
        self.calls: list[tuple] = []

    def all_reduce(self, buf, count, stream):
        self.rt.launches.append(("all_reduce", (buf, count), self.rt.capturing))

    def all_gather(self, send, recv, count, stream):
        self.rt.launches.append(("all_gather", (send, recv, count), self.rt.capturing))


def _rank_runner(golden_dir, name, world, rank):
    from forge_hip.runner import HipRunner
    from forge_hip.sharded_plan import ShardedPlan

    gguf = open_gguf(golden_dir / "models" / name)
    spec = build_spec(gguf)
    plan = ShardPlan.build(spec, gguf, world)
    rt = FakeRuntime()
    comm = RecordingComm(rt, rank, world)
    runner = HipRunner(rank_spec(spec, plan, rank), ShardView(gguf, spec, plan, rank),
                       get_plugin_manager().kernels, runtime=rt,
                       plan=partial(ShardedPlan, comm=comm, vocab=plan.vocab))  # fmt: skip
    return runner, rt, spec, plan


@pytest.mark.parametrize("name,world", [("llama-q8_0.gguf", 2), ("gemma3-f16.gguf", 4)])
def test_a_rank_reduces_each_layers_partial_sums_and_gathers_the_head(golden_dir, name, world):
    for rank in range(world):
        runner, rt, spec, plan = _rank_runner(golden_dir, name, world, rank)
        placed, ws = runner.arena.placed, runner.ws
        assert placed["output.weight"].n == len(plan.vocab[rank])
        assert placed["blk.0.attn_q.weight"].n == len(plan.heads[rank]) * spec.head_dim
        assert placed["blk.0.attn_k.weight"].n == len(plan.kv_heads[rank]) * spec.head_dim
        assert placed["blk.0.ffn_down.weight"].k == spec.ffn.n_ff // world
        assert placed["token_embd.weight"].n == spec.n_vocab  # the lookup reads every row
        runner.allocate_kv(32, 16)
        for step in range(2):
            rt.launches.clear()
            batch = [SeqBatch(np.array([5], np.int32), step, np.arange(2, dtype=np.int32)),
                     SeqBatch(np.array([7], np.int32), step, np.array([3], np.int32))]  # fmt: skip
            assert len(runner.forward_argmax(batch)) == 2
            if step:  # replayed: the collectives are in the graph with the kernels
                assert not rt.launches
        captured = _captured(runner, rt)
        assert all(cap for _, _, cap in captured)
        names = [n for n, _, _ in captured]
        reduces = [i for i, n in enumerate(names) if n == "all_reduce"]
        assert len(reduces) == 2 * spec.n_layer
        args = [a for n, a, _ in rt.launches if n == "all_reduce"]
        assert set(args) == {(ws.o, 2 * spec.n_embd)}
        # between two reduces: an attention launch (after it the output product) or the FFN
        attn = [i for i, n in enumerate(names) if n.startswith("attn_decode")]
        assert all(reduces[2 * j] > a > (reduces[2 * j - 1] if j else 0)
                   for j, a in enumerate(attn))  # fmt: skip
        gather = names.index("all_gather")
        assert gather > reduces[-1] and names[gather + 1] == "unshard_rows"
        assert names.index("sample_rows") > gather + 1
        part = max(len(v) for v in plan.vocab)
        g_args = next(a for n, a, _ in rt.launches if n == "all_gather")
        assert g_args == (runner.plan.shard_logits, runner.plan.gathered, 2 * part)
        assert next(g for n, g, _ in rt.launches if n == "unshard_rows") == (2, world)
        runner.steps.settle()
        runner.plan.close()
        runner.close()
        assert not rt.live


def _captured(runner, rt):
    """The launches of a fresh capture of the 2-row decode step."""
    rt.launches.clear()
    runner.graphs.clear()
    runner.graphs.capture(2, lambda: runner._enqueue(2))
    return list(rt.launches)


def test_the_first_collective_runs_before_any_capture(golden_dir):
    _, rt, _, _ = _rank_runner(golden_dir, "llama-q8_0.gguf", 2, 1)
    first = [launch for launch in rt.launches if launch[0] == "all_reduce"]
    assert first and not first[0][2]


def _echo(rank, world, conn, fail_rank=None):
    def handle(message):
        if message == "boom" and rank == fail_rank:
            raise UsageError(f"rank {rank} refuses")
        if message == "die" and rank == fail_rank:
            import os

            os._exit(3)
        return (rank, message)

    serve(conn, handle)


def test_a_group_answers_every_rank_and_names_a_failing_one():
    group = WorkerGroup(_echo, 3, (1,), channels=True)
    try:
        group.request("hello")
        assert group.replies() == [(0, "hello"), (1, "hello"), (2, "hello")]
        group.request("boom")  # rank 1 raises a ForgeError: raised here as its class
        with pytest.raises(UsageError, match="rank 1 refuses"):
            group.replies()
        group.request("again")  # the group still serves
        assert [r for r, _ in group.replies()] == [0, 1, 2]
        group.request("die")  # rank 1 exits mid-request: the group ends, naming it
        with pytest.raises(WorkerFailed, match="rank 1 .*exit status 3"):
            group.replies()
        assert not any(p.is_alive() for p in group.processes)
    finally:
        group.stop()


def test_a_request_to_a_dead_worker_names_it():
    group = WorkerGroup(_echo, 2, (1,), channels=True)
    try:
        group.request("hello")
        group.replies()
        group.processes[1].kill()
        group.processes[1].join()
        with pytest.raises(WorkerFailed, match="rank 1 died: killed by SIGKILL"):
            for _ in range(3):  # the pipe's buffer may take the first message
                group.request("hello")
                group.replies()
        assert not any(p.is_alive() for p in group.processes)
    finally:
        group.stop()


def test_a_host_of_other_ranks_checks_its_model_and_names_bad_arguments(golden_dir, monkeypatch,
                                                                        capsys):  # fmt: skip
    import subprocess
    import sys

    from forge_hip import tp_host

    from forge.remote_ranks import accept_ranks
    from forge.rendezvous import free_port

    monkeypatch.delenv("FORGE_TP_KEY", raising=False)
    assert tp_host.main(["m.gguf", "--master", "h:1", "--first-rank", "1", "--ranks", "1"]) == 1
    assert "FORGE_TP_KEY" in capsys.readouterr().err
    assert tp_host.main(["m.gguf", "--master", "nohost", "--first-rank", "1", "--ranks", "1"]) == 1
    assert "--master must be HOST:PORT" in capsys.readouterr().err

    key = "sixteen or more characters"
    llama = open_gguf(golden_dir / "models" / "llama-q8_0.gguf")
    spec = build_spec(llama)
    plan = ShardPlan.build(spec, llama, 2)
    port = free_port()  # the engine's "MASTER_PORT"; ranks connect to port + 1
    other = golden_dir / "models" / "gemma3-f16.gguf"  # not the engine's model
    host = subprocess.Popen([sys.executable, "-m", "forge_hip.tp_host", str(other), "--master",
                             f"127.0.0.1:{port}", "--first-rank", "1", "--ranks", "1"],
                            env={**__import__("os").environ, "FORGE_TP_KEY": key})  # fmt: skip
    try:
        conns = accept_ranks("127.0.0.1", port + 1, range(1, 2), key.encode(), 60.0)
        conns[1].send((str(other), spec, get_plugin_manager().kernels, plan, None, 256, None,
                       ("127.0.0.1", port), tp_host.tensor_table(llama)))  # fmt: skip
        assert conns[1].poll(60)
        kind, cls, text = conns[1].recv()
        assert kind == "err" and "is not the model the engine loaded" in text
        assert host.wait(30) == 0
    finally:
        host.kill()


def _fake_ranks(rank, world, conn):
    def handle(message):
        name, args = message
        if name == "forward_sample" and args[0] == "bad":
            raise UsageError("a bad batch")
        return [7] if name == "forward_sample" else None

    serve(conn, handle)


def test_a_started_steps_error_and_a_closed_runner_reach_its_tokens():
    from forge_hip.tp_runner import TensorParallelRunner

    from forge.errors import ForgeRuntimeError

    runner = TensorParallelRunner.__new__(TensorParallelRunner)  # its group: fake ranks
    runner._pending, runner.group = None, WorkerGroup(_fake_ranks, 2, channels=True)
    try:
        bad = runner.start_sample("bad", [None])
        runner.allocate_kv(4, 16)  # the started step's error is not this call's
        with pytest.raises(UsageError, match="a bad batch"):
            bad()
        assert runner.start_sample("good", [None])() == [7]
        late = runner.start_sample("good", [None])
    finally:
        runner.close()
    with pytest.raises(ForgeRuntimeError, match="closed before this step's tokens were read"):
        late()
    assert runner.group is None


def test_the_engine_takes_a_rank_from_another_host_into_its_group(golden_dir, monkeypatch):
    """The engine's side of two hosts, without GPUs: rank 1 comes from a forge_hip.tp_host
    process, gets the split and the model check through the engine, and both ranks' answers
    (here: no GPU to open) come back through the group."""
    import subprocess
    import sys

    from forge_hip import HipBackend
    from forge_hip.tp_runner import TensorParallelRunner

    from forge.errors import ForgeRuntimeError
    from forge.rendezvous import free_port

    if HipBackend().probe().available:
        pytest.skip("a GPU here would run the ranks (tests/gpu covers that)")
    path = golden_dir / "models" / "llama-q8_0.gguf"
    gguf = open_gguf(path)
    spec = build_spec(gguf)
    plan = ShardPlan.build(spec, gguf, 2)
    port, key = free_port(), "sixteen or more characters"
    for name, value in (("FORGE_TP_LOCAL_RANKS", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(port)), ("FORGE_TP_KEY", key)):  # fmt: skip
        monkeypatch.setenv(name, value)
    host = subprocess.Popen([sys.executable, "-m", "forge_hip.tp_host", str(path), "--master",
                             f"127.0.0.1:{port}", "--first-rank", "1", "--ranks", "1"],
                            env={**__import__("os").environ, "FORGE_TP_KEY": key})  # fmt: skip
    try:
        placement = plan.placement([(0, "GPU 0"), (0, "on another host")])
        with pytest.raises(ForgeRuntimeError, match="backend 'hip' is unavailable"):
            TensorParallelRunner(spec, gguf, get_plugin_manager().kernels, shard_plan=plan,
                                 placement=placement)  # fmt: skip
        assert host.wait(30) == 0  # its rank answered, then ended
    finally:
        host.kill()


def test_a_rank_on_another_host_ends_when_nccl_reports_a_peer_lost(monkeypatch, capsys):
    import forge_hip.tp_rank as tp_rank

    events = []

    class Comm:  # healthy for two checks, then a peer is gone
        rank, checks = 3, 0

        def async_error(self):
            self.checks += 1
            return None if self.checks < 3 else "remote process exited or network error"

        def close(self, abort=False):
            events.append(("close", abort))

    monkeypatch.setattr(tp_rank, "PEER_CHECK_S", 0.01)
    monkeypatch.setattr(tp_rank.os, "_exit", lambda code: events.append(("exit", code)))
    tp_rank._end_on_peer_loss(Comm())
    assert events == [("close", True), ("exit", 1)]
    assert "forge rank 3: remote process exited" in capsys.readouterr().err
