"""The core CLI commands, exit codes and error output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
import warnings
from importlib import metadata

import pytest

import forge
import forge.cli
from forge import errors
from forge.cli import main
from forge.cli.common import add_command
from forge.devices import BackendProbe
from forge.plugins import PluginManager, PluginWarning, reset_plugin_manager


@pytest.fixture(autouse=True)
def clean_env(fresh_forge_env):
    warnings.simplefilter("ignore", PluginWarning)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.strip().startswith(f"forge {metadata.version('forge-llm')}")
    assert forge.__version__ == metadata.version("forge-llm")


def test_backends_table(capsys):
    code, out, _ = run(capsys, "backends")
    assert code == 0
    header, rule, *rows = out.splitlines()
    assert header.split() == ["backend", "device", "platform/arch", "available", "reason", "score"]
    cpu = next(r for r in rows if r.startswith("cpu_simd "))
    assert " cpu/" in cpu and " yes " in cpu and cpu.rstrip().endswith("10")


def test_backends_json_and_details_rows(capsys, monkeypatch):
    class Fake(forge.backend.Backend):
        name = "fake_gpu"

        def probe(self):
            details = (("amd", "no device (hipGetDeviceCount returned 0)"),
                       ("nvidia", "cuda-python: libcuda.so.1 not found"))  # fmt: skip
            return BackendProbe(False, "no usable GPU platform", details=details)

        def open_runner(self, *a, **k):
            raise NotImplementedError

    pm = PluginManager.create(entrypoints=False)
    plugin = types.SimpleNamespace(
        forge_register_backends=forge.hookimpl(lambda register: register(Fake))
    )
    pm.register(plugin, "fake")
    monkeypatch.setattr("forge.plugins._default", pm)
    code, out, _ = run(capsys, "backends", "--json")
    data = {b["backend"]: b for b in json.loads(out)}
    assert code == 0 and data["cpu_simd"]["available"] is True
    assert data["cpu_simd"]["devices"][0]["platform"] == "cpu"
    assert data["fake_gpu"]["available"] is False and data["fake_gpu"]["plugin"] == "fake"
    assert data["fake_gpu"]["details"]["amd"] == "no device (hipGetDeviceCount returned 0)"
    code, out, _ = run(capsys, "backends")
    assert "fake_gpu" in out and "no usable GPU platform" in out
    assert "fake_gpu amd: no device (hipGetDeviceCount returned 0)" in out
    assert "fake_gpu nvidia: cuda-python: libcuda.so.1 not found" in out


def test_plugins_lists_load_errors(capsys, monkeypatch, tmp_path):
    (tmp_path / "cli_broken_plugin.py").write_text("import does_not_exist_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pm = PluginManager.create(defaults=["forge_cpu_simd.plugin", "cli_broken_plugin"],
                              entrypoints=False)  # fmt: skip
    monkeypatch.setattr("forge.plugins._default", pm)
    code, out, _ = run(capsys, "plugins", "--json")
    data = {p["name"]: p for p in json.loads(out)}
    assert code == 0
    assert data["forge_cpu_simd.plugin"]["status"] == "loaded"
    assert "forge_register_backends" in data["forge_cpu_simd.plugin"]["hooks"]
    assert data["cli_broken_plugin"]["status"] == "error"
    assert "does_not_exist_anywhere" in data["cli_broken_plugin"]["errors"][0]
    code, out, _ = run(capsys, "plugins")
    assert "cli_broken_plugin" in out and "import failed" in out
    sys.modules.pop("cli_broken_plugin", None)


def test_plugin_load_error_is_warned_on_stderr(capsys, monkeypatch):
    warnings.simplefilter("default", PluginWarning)
    defaults = ["forge_cpu_simd.plugin", "nope_plugin_module"]
    monkeypatch.setattr(
        "forge.plugins.get_plugin_manager",
        lambda: PluginManager.create(defaults=defaults, entrypoints=False),
    )
    code, out, err = run(capsys, "plugins")
    assert code == 0 and "nope_plugin_module" in out
    assert "forge: warning: forge plugin 'nope_plugin_module': import failed" in err


def test_plugins_and_kernels_show_the_example(capsys, monkeypatch):
    pytest.importorskip(
        "forge_plugin_example", reason="pip install -e examples/forge-plugin-example"
    )
    code, out, _ = run(capsys, "plugins")
    assert code == 0 and any(ln.split()[:2] == ["example", "entrypoint"] for ln in out.splitlines())
    code, out, _ = run(capsys, "kernels", "--json")
    entry = next(e for e in json.loads(out) if (e["backend"], e["op"], e["weight_type"]) ==
                 ("cpu_simd", "matmul", "F32"))  # fmt: skip
    assert entry["winner"] == {"plugin": "example", "priority": 10}
    assert {"plugin": "forge_cpu_simd.plugin", "priority": 0} in entry["candidates"]
    code, out, _ = run(capsys, "kernels")
    row = next(ln for ln in out.splitlines() if ln.split()[:3] == ["cpu_simd", "matmul", "F32"])
    assert "example (priority 10)" in row and "forge_cpu_simd.plugin (0)" in row
    monkeypatch.setenv("FORGE_PLUGINS", "")
    reset_plugin_manager()
    code, out, _ = run(capsys, "kernels")
    row = next(ln for ln in out.splitlines() if ln.split()[:3] == ["cpu_simd", "matmul", "F32"])
    assert "forge_cpu_jit.plugin (priority 10)" in row  # the built-in compiled kernel


def test_config_shows_values_and_sources(capsys, monkeypatch, tmp_path):
    (tmp_path / "forge.toml").write_text('fallback = "cpu_simd"\n[server]\napi_key = "secret"\n')
    monkeypatch.setenv("FORGE_DEVICE", "0")
    code, out, _ = run(capsys, "config", "--json", "--n-ctx", "256")
    data = json.loads(out)
    assert code == 0
    assert data["n_ctx"] == {"value": 256, "source": "flag --n-ctx"}
    assert data["device"] == {"value": 0, "source": "env FORGE_DEVICE"}
    assert data["fallback"]["source"].startswith("file ") and data["backend"]["source"] == "default"
    assert data["server.api_key"]["value"] == "(set)" and "secret" not in out  # never printed
    code, out, _ = run(capsys, "--backend", "cpu_simd", "config")
    assert "config file: " in out and "forge.toml" in out
    assert any(
        ln.split() == ["backend", "cpu_simd", "flag", "--backend"] for ln in out.splitlines()
    )


# --- exit codes and error output -------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--device", "gpu0", "config"], "device: "),
        (["config", "--log-level", "loud"], "log_level"),
    ],
)
def test_config_errors_exit_2_without_traceback(capsys, argv, text):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("forge: error: invalid configuration: ") and text in err
    assert "Traceback" not in err


def test_bad_config_file_exits_2(capsys, tmp_path):
    (tmp_path / "forge.toml").write_text("bogus = 1\n")
    code, _, err = run(capsys, "backends")
    assert code == 2 and "unknown key 'bogus'" in err and "forge.toml" in err


def test_usage_errors_exit_2(capsys):
    assert run(capsys, "no-such-command")[0] == 2
    assert run(capsys)[0] == 2
    assert run(capsys, "backends", "--frobnicate")[0] == 2
    assert run(capsys, "--help")[0] == 0


@pytest.fixture
def boom_command(monkeypatch):
    """A throwaway command that raises whatever the test puts in `raised`."""
    raised = []

    def boom(args, ctx):
        raise raised[0]

    module = types.SimpleNamespace(
        __name__="boom", add_parser=lambda sub: add_command(sub, "boom", boom, "raise")
    )
    real = forge.cli.command_modules
    monkeypatch.setattr(forge.cli, "command_modules", lambda: [*real(), module])
    return raised


@pytest.mark.parametrize(
    ("error", "code"),
    [(errors.ForgeRuntimeError("kernel failed"), 1),
     (errors.BackendUnavailableError("hip", "no device"), 1),
     (errors.ModelError("bad model"), 1),
     (errors.ConfigError("bad value"), 2),
     (errors.UsageError("bad call"), 2)],
)  # fmt: skip
def test_forge_errors_map_to_their_exit_code(capsys, boom_command, error, code):
    boom_command.append(error)
    got, _, err = run(capsys, "boom")
    assert got == code
    assert err == f"forge: error: {error}\n"


def test_unexpected_exception_exits_1_with_a_traceback(capsys, boom_command):
    boom_command.append(ZeroDivisionError("bug"))
    code, _, err = run(capsys, "boom")
    assert code == 1 and "Traceback" in err and "internal error" in err


@pytest.fixture
def select_command(monkeypatch):
    """A throwaway command that selects a backend the way `forge run` does and prints it."""

    def select(args, ctx):
        print(ctx.select_backend()[0])

    module = types.SimpleNamespace(
        __name__="select", add_parser=lambda sub: add_command(sub, "select", select, "select")
    )
    real = forge.cli.command_modules
    monkeypatch.setattr(forge.cli, "command_modules", lambda: [*real(), module])


def test_backend_selection_from_the_command_line(capsys, select_command):
    pytest.importorskip(
        "forge_plugin_example", reason="pip install -e examples/forge-plugin-example"
    )
    code, out, err = run(capsys, "select", "--backend", "cpu_simd")
    assert (code, out) == (0, "cpu_simd\n")
    assert "forge: using backend 'cpu_simd' as configured on " in err
    code, out, err = run(capsys, "select", "--backend", "example_remote")
    assert code == 1 and out == "" and "Traceback" not in err
    assert err == ("forge: error: backend 'example_remote' is unavailable: no remote endpoint "
                   "configured (this example never has one)\n")  # fmt: skip
    code, out, err = run(capsys, "--fallback", "cpu_simd", "select", "--backend", "example_remote")
    assert (code, out) == (0, "cpu_simd\n")
    assert err.startswith("forge: warning: backend 'example_remote' is unavailable (no remote")
    assert "falling back to 'cpu_simd' as configured (fallback = 'cpu_simd')" in err
    assert len(err.splitlines()) == 1
    code, out, err = run(capsys, "select")
    assert (code, out) == (0, "cpu_simd\n")
    assert err.startswith("forge: auto picked backend 'cpu_simd' (highest score 10) on ")
    assert len(err.splitlines()) == 1 and "example_remote" not in err  # details: debug
    code, out, err = run(capsys, "select", "--log-level", "debug")
    assert "unavailable backends: " in err and "example_remote (no remote endpoint" in err
    code, out, err = run(capsys, "select", "--backend", "cpu_simd", "--log-level", "warning")
    assert (code, out, err) == (0, "cpu_simd\n", "")


def test_python_dash_m_forge_and_console_script(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}

    def forge_process(*argv):
        cmd = [sys.executable, "-m", "forge", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)

    done = forge_process("--device", "x", "backends")
    assert done.returncode == 2 and done.stderr.startswith("forge: error: invalid configuration")
    done = forge_process("backends")
    assert done.returncode == 0 and "cpu_simd" in done.stdout
    script = shutil.which("forge")
    assert script, "the `forge` console script is not on PATH: pip install -e ."
    done = subprocess.run([script, "--version"], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.startswith("forge ")
