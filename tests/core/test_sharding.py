"""The tensor-parallel sharding plan (pure data): which tensor splits how, head and KV-head
replication, the bytes each rank reads (checked against the gguf package's dequantizer), and the
splits a model does not allow."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from forge.errors import UsageError
from forge.gguf import open_gguf
from forge.models import build_spec
from forge.sharding import ShardPlan


def _model(golden_dir, name):
    gguf = open_gguf(golden_dir / "models" / name)
    return build_spec(gguf), gguf


def test_megatron_splits_of_a_llama(golden_dir):
    spec, gguf = _model(golden_dir, "llama-q8_0.gguf")  # 4 heads of 64, 2 KV heads, n_ff 512
    plan = ShardPlan.build(spec, gguf, 2)
    assert plan.heads == (range(0, 2), range(2, 4)) and plan.kv_heads == (range(0, 1), range(1, 2))
    assert plan.ffn == (range(0, 256), range(256, 512))
    assert plan.vocab == (range(0, 268), range(268, 535))
    t = plan.tensors
    assert (t["blk.0.attn_q.weight"].axis, t["blk.0.attn_q.weight"].ranges) == (
        "rows", (range(0, 128), range(128, 256)))  # fmt: skip
    assert t["blk.0.attn_k.weight"].ranges == (range(0, 64), range(64, 128))
    assert t["blk.1.attn_output.weight"].axis == "cols"
    assert t["blk.1.attn_output.weight"].ranges == (range(0, 128), range(128, 256))
    assert t["blk.0.ffn_gate.weight"].axis == t["blk.0.ffn_up.weight"].axis == "rows"
    assert t["blk.0.ffn_down.weight"].axis == "cols"
    assert t["output.weight"].axis == "rows" and t["output.weight"].ranges == plan.vocab
    for name in ("token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight",
                 "blk.1.ffn_norm.weight"):  # fmt: skip
        assert t[name].axis == "none"
    assert set(t) == set(spec.weight_names())


def test_fewer_kv_heads_than_ranks_are_replicated(golden_dir):
    spec, gguf = _model(golden_dir, "llama-q8_0.gguf")
    plan = ShardPlan.build(spec, gguf, 4)  # 1 query head each; 2 KV heads for 4 ranks
    assert plan.heads == tuple(range(r, r + 1) for r in range(4))
    assert plan.kv_heads == (range(0, 1), range(0, 1), range(1, 2), range(1, 2))
    group = spec.n_head // spec.n_head_kv
    for q, kv in zip(plan.heads, plan.kv_heads):  # each rank's queries read its KV head
        assert {h // group for h in q} == set(kv)
    placement = plan.placement([(i, f"GPU {i}") for i in range(4)])
    assert placement.world_size == 4 and placement.shards[3].kv_heads == range(1, 2)
    assert placement.shards[2].vocab == range(268, 402)


@pytest.mark.parametrize("name", ["llama-q8_0.gguf", "llama-q4_0.gguf", "llama-f16.gguf"])
def test_each_ranks_bytes_are_its_part_of_the_tensor(golden_dir, name):
    """The spans a rank reads, dequantized, are exactly its rows / columns of the whole."""
    spec, gguf = _model(golden_dir, name)
    world = 2
    plan = ShardPlan.build(spec, gguf, world)
    for tensor in ("blk.0.attn_q.weight", "blk.0.attn_output.weight", "blk.1.ffn_down.weight",
                   "output.weight"):  # fmt: skip
        info, split = gguf.tensors[tensor], plan.tensors[tensor]
        qtype = GGMLQuantizationType[info.type]
        raw = gguf.raw(tensor).reshape(-1)
        whole = dequantize(raw, qtype).reshape(info.rows, info.shape[0])
        for rank in range(world):
            data = np.concatenate([raw[o : o + n] for o, n in split.byte_spans(info, rank)])
            part = split.ranges[rank]
            if split.axis == "rows":
                want = whole[part.start : part.stop]
                got = dequantize(data, qtype).reshape(len(part), info.shape[0])
            else:
                want = whole[:, part.start : part.stop]
                got = dequantize(data, qtype).reshape(info.rows, len(part))
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "name, world, words",
    [
        ("llama-q8_0.gguf", 3, "does not divide the model's 4 attention heads"),
        ("llama-q8_0.gguf", 8, "does not divide the model's 4 attention heads"),
        ("qwen2-q4_k.gguf", 2, "blk.0.attn_output.weight (Q4_K, blocks of 256) cannot be split"),
        ("llama-q8_0.gguf", 0, "tensor_parallel must be >= 1"),
    ],
)
def test_splits_a_model_does_not_allow_are_named(golden_dir, name, world, words):
    spec, gguf = _model(golden_dir, name)
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
        ShardPlan.build(spec, gguf, world)


@pytest.mark.parametrize("part", ["sinks", "out_bias"])
def test_attention_sinks_and_output_bias_are_refused(golden_dir, part):
    """A row-split output product would add its bias once per rank; sinks are per head."""
    spec, gguf = _model(golden_dir, "llama-q8_0.gguf")
    odd = spec.model_copy(update={"attention": spec.attention.model_copy(update={part: True})})
    with pytest.raises(UsageError, match="does not split attention sinks or an attention output"):
        ShardPlan.build(odd, gguf, 2)


def test_kv_heads_neither_divisor_nor_multiple_are_refused(golden_dir):
    spec, gguf = _model(golden_dir, "llama-q8_0.gguf")
    odd = spec.model_copy(update={"n_head": 6, "n_head_kv": 3})
    with pytest.raises(UsageError, match="cannot share the model's 3 KV heads"):
        ShardPlan.build(odd, gguf, 2)


class _Recorded(Exception):
    """Raised by the fake backend's open_runner with the arguments it was given."""


def _fake_gpus(monkeypatch, n_devices: int, splits: bool):
    """A plugin manager with a fake backend of `n_devices` devices whose open_runner takes a
    shard plan when `splits`, and raises _Recorded with its keyword arguments (no weights)."""
    import types

    import forge
    from forge.devices import BackendProbe, DeviceInfo
    from forge.plugins import PluginManager

    gpus = tuple(DeviceInfo(f"Fake GPU {i}", "cuda", "sm_90") for i in range(n_devices))

    class Fake(forge.backend.Backend):
        name = "fake_gpu"

        def probe(self):
            return BackendProbe(True, devices=gpus, score=100)

        if splits:

            def open_runner(self, spec, gguf, kernels, *, shard_plan=None, placement=None, **kw):
                raise _Recorded(shard_plan, placement)
        else:

            def open_runner(self, spec, gguf, kernels, **kw):
                raise _Recorded(None, None)

    pm = PluginManager.create(entrypoints=False)
    hook = forge.hookimpl(lambda register: register(Fake))
    pm.register(types.SimpleNamespace(forge_register_backends=hook), "fake")
    monkeypatch.setattr("forge.plugins._default", pm)


def test_load_hands_the_plan_and_placement_to_a_backend_that_splits(golden_dir, monkeypatch):
    import forge

    _fake_gpus(monkeypatch, 4, splits=True)
    path = str(golden_dir / "models" / "llama-q8_0.gguf")
    with pytest.raises(_Recorded) as got:
        forge.load(path, backend="fake_gpu", config={"tensor_parallel": 2, "device": 1})
    plan, placement = got.value.args
    assert plan.world == 2 and plan.heads == (range(0, 2), range(2, 4))
    assert [(s.rank, s.device, s.device_name) for s in placement.shards] == [
        (0, 1, "Fake GPU 1"), (1, 2, "Fake GPU 2")]  # fmt: skip
    assert placement.shards[1].vocab == range(268, 535)


@pytest.mark.parametrize(("world", "device", "splits", "message"), [
    (3, 0, True, "tensor_parallel = 3 does not divide the model's 4 attention heads"),
    (4, 1, True, "from device 1 needs devices 1..4, but backend 'fake_gpu' has 4"),
    (2, 0, False, "backend 'fake_gpu' runs a model on one device only: tensor_parallel = 2"),
])  # fmt: skip
def test_load_refuses_a_bad_tensor_parallel_before_any_weight(golden_dir, monkeypatch, world,
                                                              device, splits, message):  # fmt: skip
    import forge

    _fake_gpus(monkeypatch, 4, splits)
    path = str(golden_dir / "models" / "llama-q8_0.gguf")
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(".", r"\.")):
        forge.load(path, backend="fake_gpu", config={"tensor_parallel": world, "device": device})


def test_cli_names_a_tensor_parallel_the_cpu_cannot_run(golden_dir, capsys):
    from forge.cli import main

    path = str(golden_dir / "models" / "llama-q8_0.gguf")
    code = main(["run", "-m", path, "--backend", "cpu_simd", "-tp", "2", "-n", "1", "-p", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert "tensor_parallel = 2 from device 0 needs devices 0..1, but backend 'cpu_simd'" in err
    assert main(["config", "--tensor-parallel", "0"]) != 0
    assert "tensor_parallel" in capsys.readouterr().err


def test_ranks_on_other_hosts_need_only_this_hosts_devices(golden_dir, monkeypatch):
    import forge

    _fake_gpus(monkeypatch, 2, splits=True)
    path = str(golden_dir / "models" / "llama-q8_0.gguf")
    monkeypatch.setenv("FORGE_TP_LOCAL_RANKS", "2")  # 2 of 4 here, 2 on another host
    with pytest.raises(_Recorded) as got:
        forge.load(path, backend="fake_gpu", config={"tensor_parallel": 4})
    placement = got.value.args[1]
    assert [(s.rank, s.device, s.device_name) for s in placement.shards] == [
        (0, 0, "Fake GPU 0"), (1, 1, "Fake GPU 1"), (2, 0, "on another host"),
        (3, 1, "on another host")]  # fmt: skip
    for local, message in (("3", "needs devices 0..2, but backend 'fake_gpu' has 2"),
                           ("5", "FORGE_TP_LOCAL_RANKS must be 1..4"),
                           ("two", "FORGE_TP_LOCAL_RANKS must be 1..4")):  # fmt: skip
        monkeypatch.setenv("FORGE_TP_LOCAL_RANKS", local)
        with pytest.raises(UsageError, match=message.replace(".", r"\.")):
            forge.load(path, backend="fake_gpu", config={"tensor_parallel": 4})
