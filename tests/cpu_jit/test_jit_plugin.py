"""cpu_jit as a plugin: registration and `forge kernels`, the config key that forces NumPy, the
weight layout cpu_simd keeps (no float32 copies), the fallbacks, the on-disk cache and memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import forge
from forge.plugins import get_plugin_manager

ROOT = Path(__file__).resolve().parents[2]
numba = pytest.importorskip("numba")


def _python(code: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=full, cwd=ROOT, timeout=timeout)  # fmt: skip


def test_registered_above_numpy_and_shown_by_forge_kernels(fresh_forge_env, capsys):
    from forge.cli import main

    kernels = get_plugin_manager().kernels
    for t in ("Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K", "F16", "BF16"):
        won = kernels.get("cpu_simd", "matmul", t)
        assert (won.plugin, won.priority) == ("forge_cpu_jit.plugin", 10)
    f32 = [(k.plugin, k.priority) for k in kernels.candidates("cpu_simd", "matmul", "F32")]
    assert ("forge_cpu_jit.plugin", 10) in f32  # (the example plugin, when installed, wins F32)
    for op in ("attention", "decode_attention"):  # NumPy's by default, compiled when invariant
        assert kernels.get("cpu_simd", op, "*").plugin == "forge_cpu_simd.plugin"
        won = kernels.batch_invariant().get("cpu_simd", op, "*")
        assert won.plugin == "forge_cpu_jit.plugin" and won.impl.batch_invariant
    assert main(["kernels", "--json"]) == 0
    want = ("cpu_simd", "matmul", "Q4_K")
    entry = next(
        e
        for e in json.loads(capsys.readouterr().out)
        if (e["backend"], e["op"], e["weight_type"]) == want
    )
    assert entry["winner"] == {"plugin": "forge_cpu_jit.plugin", "priority": 10}
    assert main(["kernels", "--kernels", "builtin"]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.split()[:3] == ["cpu_simd", "matmul", "Q4_K"])
    assert "forge_cpu_simd.plugin (priority 0)" in row and "forge_cpu_jit.plugin (10)" in row
    assert 'kernels = "builtin"' in out


def test_block_layout_kept_and_builtin_forces_numpy(golden_dir):
    from forge_cpu_jit.kernel import BlockWeight
    from forge_cpu_simd.loading import weight_bytes
    from forge_cpu_simd.matmul import DenseWeight

    path = str(golden_dir / "models" / "qwen3-q4_k_m.gguf")  # tied output head
    model = forge.load(path, backend="cpu_simd", n_ctx=64)
    head = model.runner.output.weight
    assert isinstance(head, BlockWeight)
    # the tied head reads token_embd's mapped bytes: no copy of any kind
    embd = model.gguf.raw("token_embd.weight")
    assert np.shares_memory(head.raw, embd) and not head.raw.flags.writeable
    est = model.runner.memory_estimate()["weights"]
    as_float32 = sum(model.gguf.tensors[n].n_elements * 4 for n in model.gguf.tensors)
    # the matrices count as their GGUF bytes, in the runner's estimate and in the preflight's
    assert est <= weight_bytes(model.spec, model.gguf) < as_float32 / 3
    ids = model.tokenize("Once upon a time")
    jit_logits = model.logits(ids)

    numpy_model = forge.load(path, backend="cpu_simd", n_ctx=64, config={"kernels": "builtin"})
    assert isinstance(numpy_model.runner.output.weight, DenseWeight)
    numpy_logits = numpy_model.logits(ids)
    err = np.abs(jit_logits - numpy_logits).max() / numpy_logits.std()
    assert err < 0.05, err  # the same model: only the float summation order differs


def test_missing_numba_says_so_once_and_runs_numpy(golden_dir):
    code = f"""
        import sys, warnings
        sys.modules["numba"] = None  # as if numba were not installed
        warnings.simplefilter("always")
        import forge
        from forge_cpu_simd.matmul import DenseWeight
        m = forge.load({str(golden_dir / "models" / "llama-q4_0.gguf")!r}, backend="cpu_simd")
        assert isinstance(m.runner.output.weight, DenseWeight)
        print(len(m.complete("Once upon", max_tokens=4, temperature=0).tokens))
    """
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4"
    assert done.stderr.count("compiled CPU kernels need numba") == 2  # the log line + warning


def test_failed_compile_falls_back_to_numpy_once(monkeypatch, golden_dir):
    from forge_cpu_jit import jit, kernel
    from forge_cpu_simd.matmul import DenseWeight

    monkeypatch.setattr(kernel, "_said", set())
    real = jit.compile_types

    def failing(types, also=()):
        found = real(types, also)
        return {t: ("LoweringError: injected" if t == "Q8_0" else s) for t, s in found.items()}

    monkeypatch.setattr(jit, "compile_types", failing)
    with pytest.warns(kernel.CompiledKernelWarning, match="Q8_0 kernel failed to compile"):
        model = forge.load(str(golden_dir / "models" / "llama-q8_0.gguf"), backend="cpu_simd")
    assert isinstance(model.runner.output.weight, DenseWeight)
    assert np.isfinite(model.logits(model.tokenize("Hello"))).all()


def test_cache_in_the_user_cache_dir_progress_once(tmp_path, golden_dir):
    """A first run compiles into $FORGE_CACHE_DIR/cpu_jit and says so; the next loads the cache
    quietly; nothing is written beside the installed sources."""
    code = f"""
        import time, forge
        from forge_cpu_jit import jit
        jit.PROGRESS_AFTER_S = 0.0
        t = time.perf_counter()
        m = forge.load({str(golden_dir / "models" / "llama-q4_1.gguf")!r}, backend="cpu_simd")
        print(round(time.perf_counter() - t, 2))
    """
    env = {"FORGE_CACHE_DIR": str(tmp_path)}
    package = Path(__import__("forge_cpu_jit").__file__).parent
    beside = set(package.rglob("*.nb[ic]"))
    first = _python(code, env)
    assert first.returncode == 0, first.stderr
    assert "compiling the CPU kernels for Q4_1" in first.stderr
    assert list((tmp_path / "cpu_jit").rglob("*.nbi")), "no numba index in the cache dir"
    second = _python(code.replace("PROGRESS_AFTER_S = 0.0", "PROGRESS_AFTER_S = 5.0"), env)
    assert second.returncode == 0 and "compiling" not in second.stderr
    assert set(package.rglob("*.nb[ic]")) == beside  # nothing new beside the sources


def test_unwritable_cache_dir_falls_back(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code = """
        from forge_cpu_jit import jit
        print(jit.CACHE_DIR)
        print(jit.compile_types(["Q4_0"])["Q4_0"])
    """
    done = _python(code, {"FORGE_CACHE_DIR": str(blocker / "sub")})
    assert done.returncode == 0, done.stderr
    where, state = done.stdout.split()
    assert "forge-cpu_jit" in where and state == "True"


@pytest.mark.skipif(sys.platform != "linux", reason="VmHWM is Linux's /proc")
def test_default_model_peak_rss_under_600_mb(default_model_path):
    # VmHWM, not ru_maxrss: a child started by fork/vfork inherits its parent's (pytest's) peak
    # in ru_maxrss across exec, and pytest has loaded models by now
    code = f"""
        import forge
        m = forge.load({default_model_path!r}, backend="cpu_simd", n_ctx=512)
        m.complete("The capital of France is", max_tokens=8, temperature=0)
        with open("/proc/self/status") as f:
            print(next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) // 1024)
    """
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) <= 600, done.stdout


def test_generated_kernels_are_what_codegen_writes():
    """generated.py is codegen.py's output: a template edited without regenerating (or a hand
    edit of the generated file) fails here."""
    from forge_cpu_jit import codegen

    assert codegen.GENERATED.read_text() == codegen.generate()
