"""``forge inspect``: rows checked against gguf.GGUFReader and hand-computed memory figures, and
one-line errors (no traceback) for files that cannot be read."""

from __future__ import annotations

import json
import os
import re
import types
import warnings

import gguf
import numpy as np
import pytest

import forge
from forge.cli import main
from forge.devices import BackendProbe
from forge.plugins import PluginManager, PluginWarning
from tests.support.gguf_factory import rewrite_gguf

SRC = "llama-q8_0.gguf"


@pytest.fixture(autouse=True)
def clean_env(fresh_forge_env):
    warnings.simplefilter("ignore", PluginWarning)


@pytest.fixture
def model(golden_dir):
    return str(golden_dir / "models" / SRC)


@pytest.fixture
def cpu_only(monkeypatch):
    """Only the cpu_simd plugin, so that the memory table does not depend on what is installed."""
    pm = PluginManager.create(defaults=["forge_cpu_simd.plugin"], entrypoints=False)
    monkeypatch.setattr("forge.plugins._default", pm)
    return pm


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def reference(path):
    """Tensors as (name, type, GGML shape, bytes, elements) from gguf.GGUFReader."""
    r = gguf.GGUFReader(path)
    return [
        (t.name, gguf.GGMLQuantizationType(t.tensor_type).name, [int(d) for d in t.shape],
         int(t.n_bytes), int(t.n_elements))
        for t in r.tensors
    ]  # fmt: skip


def expected_memory(path, n_ctx):
    """cpu_simd's memory by hand: float32 copies of every weight but the untied embedding,
    and an f32 K and V per layer, KV head and position (golden Llama: 2 layers, 2 KV heads
    of 64)."""
    tensors = reference(path)
    weights = sum(4 * n for name, *_, n in tensors if name != "token_embd.weight")
    kv = n_ctx * 2 * 2 * (64 + 64) * 4
    return weights, kv


def test_text_report_rows(capsys, model, cpu_only):
    code, out, err = run(capsys, "inspect", model)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"file: {model} (1.5 MiB), GGUF v3, alignment 32")
    assert lines[1].startswith("model: llama 'synthetic-llama': 2 layers, n_embd 256, 4 heads")
    rows = {line.split()[0]: line.split() for line in lines if line and line[0] not in " -"}
    assert rows["llama.block_count"][1:] == ["int", "2"]
    assert rows["llama.attention.layer_norm_rms_epsilon"][1] == "float"
    tokens = rows["tokenizer.ggml.tokens"]
    assert tokens[1:3] == ["array[str]", "x535"]
    assert " ".join(tokens[3:]) == "['<unk>', '<s>', '</s>', '<pad>', '<0x00>', '<0x01>', " \
                                   "'<0x02>', '<0x03>', ...]"  # fmt: skip
    assert rows["tokenizer.ggml.token_type"][1:3] == ["array[int32]", "x535"]
    ref = reference(model)
    assert f"tensors ({len(ref)})" in lines
    for name, ttype, shape, nbytes, _ in ref:
        assert rows[name] == [name, ttype, *" x ".join(map(str, shape)).split(), str(nbytes)]
    by_type = {}
    for _, ttype, _, nbytes, n in ref:
        t = by_type.setdefault(ttype, [0, 0, 0])
        t[0], t[1], t[2] = t[0] + 1, t[1] + n, t[2] + nbytes
    for ttype, (count, elements, nbytes) in by_type.items():
        assert rows[ttype][:4] == [ttype, str(count), str(elements), str(nbytes)]
    assert "memory needed at n_ctx 1024 (configured 4096, capped at the trained context)" in out
    weights, kv = expected_memory(model, 1024)
    assert kv == 2 << 20
    cpu = rows["cpu_simd"]
    assert cpu[1] == "yes" and cpu[2:6] == [f"{weights / 2**20:.1f}", "MiB", "2.0", "MiB"]


def test_json_report(capsys, model, cpu_only):
    code, out, _ = run(capsys, "inspect", model, "--json", "--n-ctx", "256", "--items", "3")
    assert code == 0
    data = json.loads(out)
    ref = gguf.GGUFReader(model)
    assert data["gguf_version"] == 3 and data["file_bytes"] == os.path.getsize(model)
    assert data["spec"]["arch"] == "llama" and data["spec"]["n_layer"] == 2
    assert data["spec_error"] is None
    md = data["metadata"]
    assert set(md) == {k for k in ref.fields if not k.startswith("GGUF.")}
    assert md["tokenizer.ggml.tokens"] == {
        "type": "array[str]", "length": 535,
        "value": ref.fields["tokenizer.ggml.tokens"].contents()[:3],
    }  # fmt: skip
    scores = ref.fields["tokenizer.ggml.scores"].contents()[:3]
    np.testing.assert_array_equal(md["tokenizer.ggml.scores"]["value"], scores)
    assert md["llama.context_length"] == {"type": "int", "value": 1024}
    assert [(t["name"], t["type"], t["shape"], t["bytes"]) for t in data["tensors"]] == [
        r[:4] for r in reference(model)
    ]
    assert [t["offset"] for t in data["tensors"]] == [t.data_offset for t in ref.tensors]
    weights, kv = expected_memory(model, 256)
    assert data["n_ctx"] == 256
    cpu = data["memory"]["cpu_simd"]
    assert (cpu["weights"], cpu["kv_cache"], cpu["total"]) == (weights, kv, weights + kv)
    assert cpu["available"] is True and cpu["device_free"] > 0


def test_every_backend_is_asked_and_a_failing_estimate_is_shown(capsys, model, cpu_only):
    class Broken(forge.backend.Backend):
        name = "broken_est"

        def probe(self):
            return BackendProbe(False, "not here")

        def open_runner(self, *a, **k):
            raise NotImplementedError

        def memory_needed(self, spec, gguf, n_ctx):
            raise RuntimeError("estimate exploded")

    class Silent(Broken):
        name = "silent"

        def memory_needed(self, spec, gguf, n_ctx):
            return {}

    plugin = types.SimpleNamespace(
        forge_register_backends=forge.hookimpl(lambda register: [register(Broken),
                                                                  register(Silent)])
    )  # fmt: skip
    cpu_only.register(plugin, "fake")
    code, out, _ = run(capsys, "inspect", model)
    assert code == 0
    assert re.search(r"\nbroken_est +no +error: RuntimeError: estimate exploded +-\n", out)
    assert re.search(r"\nsilent +no +not reported +-\n", out)
    data = json.loads(run(capsys, "inspect", model, "--json")[1])
    assert data["memory"]["broken_est"]["error"] == "RuntimeError: estimate exploded"
    assert data["memory"]["silent"]["total"] is None


def test_default_model(capsys, default_model_path, cpu_only):
    code, out, _ = run(capsys, "inspect", "--n-ctx", "512")
    assert code == 0
    assert f"file: {default_model_path}" in out
    assert "model: gemma3 'Gemma 3 270m': 18 layers" in out
    assert "array[str] x262144" in out
    assert "memory needed at n_ctx 512, KV cache K auto, V auto\n" in out


def test_unbuildable_model_is_shown_then_fails(capsys, golden_dir, tmp_path, cpu_only):
    path = rewrite_gguf(golden_dir / "models" / SRC, tmp_path / "mamba.gguf", arch="mamba")
    code, out, err = run(capsys, "inspect", str(path))
    assert code == 1
    assert "model: cannot be built:" in out and "token_embd.weight" in out
    assert "memory needed" not in out
    assert err.count("\n") == 1 and err.startswith("forge: error: ")
    assert "unknown architecture 'mamba'" in err


@pytest.mark.parametrize(
    "content, message",
    [
        (b"GGML" + bytes(20), "bad magic"),
        (b"GGUF\x03\x00\x00\x00" + bytes(7), "truncated: tensor count"),
        (b"", "file is empty"),
        (None, "no such file"),
        ("dir", "is a directory"),
    ],
)
def test_unreadable_file_is_one_line_error(capsys, tmp_path, content, message):
    path = tmp_path / "bad.gguf"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    code, out, err = run(capsys, "inspect", str(path))
    assert code in (1, 2)
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"forge: error: {path}: ")
    assert message in err and "Traceback" not in err


def test_memory_counts_the_chosen_kv_cache_types(capsys, model, cpu_only):
    """-ctk / -ctv: K as Q8_0 (34 bytes per 32 values) and V as Q4_0 (18 per 32) instead of
    float32's 128 bytes per 32."""
    code, out, _ = run(capsys, "inspect", model, "--json", "--n-ctx", "256", "-ctk", "q8_0",
                       "-ctv", "q4_0")  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert data["kv_cache_types"] == ["q8_0", "q4_0"]
    per_32 = 34 + 18  # K and V of 32 values
    assert data["memory"]["cpu_simd"]["kv_cache"] == 256 * 2 * 2 * (64 // 32) * per_32


@pytest.mark.parametrize("name, used", [("qwen3moe-q4_k_m.gguf", 2 / 8),
                                        ("gpt-oss-mxfp4.gguf", 4 / 8)])  # fmt: skip
def test_mixture_of_experts_parameters_and_memory(capsys, golden_dir, cpu_only, name, used):
    path = str(golden_dir / "models" / name)
    tensors = reference(path)
    total = sum(n for *_, n in tensors)
    experts = sum(n for t, *_, n in tensors if "_exps." in t)
    active = total - experts + round(experts * used)
    code, out, _ = run(capsys, "inspect", path)
    assert code == 0
    assert f"parameters: {total / 1e6:.3g} M total, {active / 1e6:.3g} M active per token" in out
    assert re.search(r"\d+ layers, .*, 8 experts \(\d used\) of n_ff \d+, vocab", out)
    data = json.loads(run(capsys, "inspect", path, "--json", "--n-ctx", "256")[1])
    assert data["parameters"] == {"total": total, "active_per_token": active}
    # cpu_simd: float32 copies of the dense weights, the experts as stored (mapped) plus at
    # most their float32 size in its caches of prepared experts
    stored = sum(b for t, _, _, b, _ in tensors if "_exps.weight" in t)
    f32 = sum(4 * n for t, *_, n in tensors if "_exps.weight" in t)
    dense = sum(
        4 * n for t, *_, n in tensors if "_exps.weight" not in t and t != "token_embd.weight"
    )
    assert data["memory"]["cpu_simd"]["weights"] == dense + stored + f32
