"""The plugin manager: loading, load errors, collection, probing and backend selection."""

from __future__ import annotations

import logging
import sys
import types
import warnings

import numpy as np
import pytest

import forge
from forge.backend import Backend
from forge.devices import BackendProbe, DeviceInfo
from forge.errors import BackendUnavailableError
from forge.hookspecs import HOOK_API_VERSION
from forge.plugins import PluginManager, PluginWarning

pytestmark = pytest.mark.usefixtures("fresh_forge_env")


def quiet_create(**kw) -> PluginManager:
    """A manager, ignoring load warnings that are not under test (e.g. an absent forge_hip)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)
        return PluginManager.create(**kw)


@pytest.fixture
def pm() -> PluginManager:
    """Default plugins only (no entry points): what every install has."""
    return quiet_create(entrypoints=False)


def make_backend(name, available=True, score=5, reason="", platform="cuda", boom=None):
    """A throwaway Backend class whose probe reports what it is told (or raises `boom`)."""

    def probe(self):
        if boom is not None:
            raise boom
        dev = DeviceInfo(name=f"{name} device", platform=platform, arch="test")
        return BackendProbe(available, reason, (dev,), score)

    def open_runner(self, *args, **kw):
        raise NotImplementedError

    return type(
        f"{name}_cls", (Backend,), {"name": name, "probe": probe, "open_runner": open_runner}
    )


def backend_plugin(*classes):
    """An inline plugin object registering `classes` as backends."""

    class Plugin:
        @forge.hookimpl
        def forge_register_backends(self, register):
            for cls in classes:
                register(cls)

    return Plugin()


class Cfg:
    def __init__(self, backend="auto", fallback=None, device=0):
        self.backend, self.fallback, self.device = backend, fallback, device


# --- loading and load errors -------------------------------------------------------------------
def test_default_plugins_register_through_the_hooks(pm):
    info = pm.infos["forge_cpu_simd.plugin"]
    assert info.status == "loaded" and info.source == "default"
    assert "forge_register_backends" in info.hooks
    assert pm.backends["cpu_simd"].__name__ == "CpuSimdBackend"
    assert pm.backend_plugin("cpu_simd") == "forge_cpu_simd.plugin"
    assert pm.infos["forge.sampling.builtin"].status == "loaded"


def test_module_that_fails_to_import_is_a_load_error_not_a_crash(monkeypatch, tmp_path):
    (tmp_path / "broken_forge_plugin.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(PluginWarning) as record:
        pm = PluginManager.create(
            defaults=["forge_cpu_simd.plugin", "broken_forge_plugin", "no_such_forge_module"],
            entrypoints=False,
        )
    messages = " | ".join(str(w.message) for w in record)
    assert "boom at import" in messages and "no_such_forge_module" in messages
    assert pm.infos["broken_forge_plugin"].status == "error"
    assert "RuntimeError: boom at import" in pm.infos["broken_forge_plugin"].errors[0]
    assert "no_such_forge_module" in pm.infos["no_such_forge_module"].errors[0]
    assert set(pm.load_errors) == {"broken_forge_plugin", "no_such_forge_module"}
    assert pm.probe("cpu_simd").available  # the others still work
    sys.modules.pop("broken_forge_plugin", None)


def test_hook_that_raises_is_charged_to_its_plugin_and_contributes_nothing(pm):
    good = make_backend("good_one")
    half = make_backend("registered_before_raise")

    class Raising:
        @forge.hookimpl
        def forge_register_backends(self, register):
            register(half)
            raise ValueError("plugin bug")

    pm.register(backend_plugin(good), "good")
    pm.register(Raising(), "raising")
    with pytest.warns(PluginWarning, match="plugin bug"):
        backends = pm.backends
    assert "good_one" in backends and "cpu_simd" in backends
    assert "registered_before_raise" not in backends
    info = pm.infos["raising"]
    assert info.status == "error"
    assert "forge_register_backends raised ValueError: plugin bug" in info.errors[0]
    assert pm.infos["good"].status == "loaded"


def test_hooks_run_through_pluggy_wrappers_and_ordering(pm):
    """A wrapper runs around every other implementation and sees their (None) results; a
    tryfirst implementation is called before the others, as pluggy documents."""
    seen = []

    class Wrapper:
        @forge.hookimpl(wrapper=True)
        def forge_register_kernels(self, register):
            seen.append("wrapper before")
            results = yield
            seen.append(f"wrapper after {len(results)} results")
            return results

    class First:
        @forge.hookimpl(tryfirst=True)
        def forge_register_kernels(self, register):
            seen.append("first")
            register("cpu_simd", "rms_norm", "*", "first-impl", priority=50)

    class Plain:
        @forge.hookimpl
        def forge_register_kernels(self, register):
            seen.append("plain")

    pm.register(Wrapper(), "wrapper")
    pm.register(Plain(), "plain")
    pm.register(First(), "first")
    kernel = pm.kernels.get("cpu_simd", "rms_norm")
    assert (kernel.impl, kernel.plugin) == ("first-impl", "first")
    assert seen[:2] == ["wrapper before", "first"] and "plain" in seen
    assert seen[-1] == "wrapper after 0 results"


def test_wrapper_that_raises_is_charged_to_its_plugin(pm):
    class BadWrapper:
        @forge.hookimpl(wrapper=True)
        def forge_register_backends(self, register):
            yield
            raise RuntimeError("wrapper bug")

    pm.register(BadWrapper(), "bad-wrapper")
    with pytest.warns(PluginWarning, match="wrapper bug"):
        pm.backends  # noqa: B018 - collecting runs the hooks
    assert pm.infos["bad-wrapper"].status == "error"
    assert (
        "forge_register_backends raised RuntimeError: wrapper bug"
        in (pm.infos["bad-wrapper"].errors[0])
    )


@pytest.mark.parametrize("declared", [HOOK_API_VERSION + 1, 0, "99.1", "garbage"])
def test_hook_api_version_mismatch_is_refused(pm, declared):
    plugin = types.SimpleNamespace(FORGE_HOOK_API=declared)
    plugin.forge_register_backends = forge.hookimpl(
        lambda register: register(make_backend("from_the_future"))
    )
    with pytest.warns(PluginWarning, match="hook API"):
        info = pm.register(plugin, "future")
    assert info.status == "error"
    assert f"hook API {declared}" in info.errors[0] and str(HOOK_API_VERSION) in info.errors[0]
    assert "from_the_future" not in pm.backends
    assert pm.pm.get_plugin("future") is None


def test_matching_hook_api_version_is_accepted(pm):
    plugin = backend_plugin(make_backend("current"))
    plugin.FORGE_HOOK_API = f"{HOOK_API_VERSION}.7"
    assert pm.register(plugin, "current").status == "loaded"
    assert "current" in pm.backends


def test_bad_registrations_are_reported(pm):
    class Bad:
        @forge.hookimpl
        def forge_register_backends(self, register):
            register(object)  # not a Backend
            register(make_backend("cpu_simd"))  # name taken by the built-in

        @forge.hookimpl
        def forge_register_kernels(self, register):
            register("cpu_simd")  # missing op

        @forge.hookimpl
        def forge_register_samplers(self, register):
            register("top_k", lambda p: None)  # name taken by the built-in

    pm.register(Bad(), "bad")
    with pytest.warns(PluginWarning):
        assert "cpu_simd" in pm.backends
    errors = " | ".join(pm.infos["bad"].errors)
    assert "not a Backend subclass" in errors
    assert "'cpu_simd' is already registered by plugin 'forge_cpu_simd.plugin'" in errors
    assert "bad kernel registration" in errors
    assert "bad sampler registration" in errors and "top_k" in errors
    assert pm.backend_plugin("cpu_simd") == "forge_cpu_simd.plugin"


def test_unknown_hook_name_is_reported(pm):
    class Typo:
        @forge.hookimpl
        def forge_register_backend(self, register):  # missing "s"
            pass

    with pytest.warns(PluginWarning, match="unknown hook 'forge_register_backend'"):
        info = pm.register(Typo(), "typo")
    assert info.status == "error"


def test_unregister_removes_a_throwaway_plugin(pm):
    pm.register(backend_plugin(make_backend("temp")), "temp")
    assert "temp" in pm.backends
    pm.unregister("temp")
    assert "temp" not in pm.backends and "temp" not in pm.infos


# --- kernels and samplers -----------------------------------------------------------------------
def test_kernel_priority_and_registering_plugin(pm):
    class Faster:
        @forge.hookimpl
        def forge_register_kernels(self, register):
            register("cpu_simd", "matmul", "Q4_K", "faster-impl", priority=20)
            register("cpu_simd", "rms_norm", "*", "norm-impl", priority=20)

    pm.register(Faster(), "faster")
    win = pm.kernels.get("cpu_simd", "matmul", "Q4_K")
    assert (win.impl, win.plugin, win.priority) == ("faster-impl", "faster", 20)
    plugins = [k.plugin for k in pm.kernels.candidates("cpu_simd", "matmul", "Q4_K")]
    # the compiled kernels (priority 10) above the built-in NumPy one (0)
    assert plugins == ["faster", "forge_cpu_jit.plugin", "forge_cpu_simd.plugin"]
    assert pm.kernels.get("cpu_simd", "matmul", "Q8_0").plugin == "forge_cpu_jit.plugin"
    assert pm.kernels.get("cpu_simd", "rms_norm", "F16").impl == "norm-impl"  # any-type kernel


def test_equal_priority_goes_to_the_later_plugin(pm):
    class Same:
        @forge.hookimpl
        def forge_register_kernels(self, register):
            register("cpu_simd", "matmul", "Q8_0", "same-priority", priority=10)

    pm.register(Same(), "same")  # forge_cpu_jit registered Q8_0 at 10 before it
    assert pm.kernels.get("cpu_simd", "matmul", "Q8_0").plugin == "same"


def test_sampler_registry_names_the_registering_plugin(pm):
    class Stage:
        @forge.hookimpl
        def forge_register_samplers(self, register):
            register("double", lambda params: lambda logits, ctx: logits * 2)

    pm.register(Stage(), "stage")
    registry = pm.samplers
    assert registry.get("double").plugin == "stage"
    assert registry.get("top_k").plugin == "forge.sampling.builtin"
    assert registry.get("greedy").kind == "sampler"


# --- probing --------------------------------------------------------------------------------
def test_probe_that_raises_becomes_unavailable_with_the_exception_text(pm):
    pm.register(backend_plugin(make_backend("buggy", boom=OSError("driver exploded"))), "b")
    probe = pm.probe("buggy")
    assert not probe.available
    assert "OSError: driver exploded" in probe.reason
    assert pm.probe_all()["cpu_simd"].available


def test_probe_returning_garbage_is_unavailable(pm):
    cls = make_backend("garbage")
    cls.probe = lambda self: {"available": True}
    pm.register(backend_plugin(cls), "g")
    assert not pm.probe("garbage").available
    assert "not a BackendProbe" in pm.probe("garbage").reason


def test_backend_whose_constructor_raises_is_unavailable(pm):
    cls = make_backend("ctor")
    cls.__init__ = lambda self: (_ for _ in ()).throw(RuntimeError("no ctor"))
    pm.register(backend_plugin(cls), "c")
    assert "RuntimeError: no ctor" in pm.probe("ctor").reason


# --- selection --------------------------------------------------------------------------------
def test_explicit_available_backend(pm, caplog):
    with caplog.at_level(logging.INFO, logger="forge"):
        name, reason = pm.select_backend(Cfg("cpu_simd"))
    assert name == "cpu_simd" and "as configured" in reason
    assert [r.getMessage() for r in caplog.records if r.name == "forge"] == [reason]


def test_explicit_unavailable_backend_raises_with_the_probe_reason(pm):
    pm.register(backend_plugin(make_backend("gpu", False, reason="no device found")), "gpu")
    with pytest.raises(BackendUnavailableError) as info:
        pm.select_backend(Cfg("gpu"))
    assert info.value.recoverable and info.value.backend == "gpu"
    assert "no device found" in str(info.value) and info.value.exit_code == 1


def test_unknown_backend_name_lists_the_known_ones(pm):
    with pytest.raises(BackendUnavailableError, match="known: cpu_simd"):
        pm.select_backend(Cfg("nope"))


def test_fallback_is_used_and_logged_once(pm, caplog):
    pm.register(backend_plugin(make_backend("gpu", False, reason="no device found")), "gpu")
    with caplog.at_level(logging.INFO, logger="forge"):
        name, reason = pm.select_backend(Cfg("gpu", fallback="cpu_simd"))
    assert name == "cpu_simd"
    lines = [r for r in caplog.records if r.name == "forge"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    msg = lines[0].getMessage()
    assert "'gpu' is unavailable (no device found)" in msg and "falling back to 'cpu_simd'" in msg


def test_unavailable_fallback_reports_both_reasons(pm):
    pm.register(backend_plugin(make_backend("gpu", False, reason="no device"),
                               make_backend("gpu2", False, reason="no driver")), "g")  # fmt: skip
    with pytest.raises(BackendUnavailableError) as info:
        pm.select_backend(Cfg("gpu", fallback="gpu2"))
    assert "no device" in str(info.value) and "no driver" in str(info.value)


def test_auto_picks_highest_available_score_and_says_why(pm, caplog):
    absent = make_backend("faster_but_absent", False, 99, "not here")
    pm.register(backend_plugin(make_backend("fast", True, score=50), absent), "p")
    with caplog.at_level(logging.DEBUG, logger="forge"):
        name, reason = pm.select_backend(Cfg("auto"))
    assert name == "fast"
    assert "auto picked backend 'fast' (highest score 50)" in reason
    assert "faster_but_absent" not in reason  # one short line: the details are debug output
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "forge"]
    assert (logging.INFO, reason) in messages
    assert any(level == logging.DEBUG and "faster_but_absent (not here)" in text
               for level, text in messages)  # fmt: skip


def test_auto_says_it_fell_back_to_the_cpu(pm, caplog):
    pm.register(backend_plugin(make_backend("gpu", False, 100, "no device")), "gpu")
    with caplog.at_level(logging.INFO, logger="forge"):
        name, reason = pm.select_backend(Cfg())
    assert name == "cpu_simd"
    assert "fell back to the CPU" in reason and "forge backends" in reason
    assert "gpu (no device)" not in reason
    assert any("fell back to the CPU" in r.getMessage() for r in caplog.records)


def test_auto_with_nothing_available(pm):
    for name in list(pm.infos):
        pm.unregister(name)
    pm.register(backend_plugin(make_backend("gpu", False, reason="no device")), "gpu")
    with pytest.raises(BackendUnavailableError, match="no backend is available: gpu"):
        pm.select_backend(Cfg())


def test_device_index_out_of_range(pm):
    with pytest.raises(BackendUnavailableError, match="device 3 requested"):
        pm.select_backend(Cfg("cpu_simd", device=3))


def test_backend_selected_hook_is_called_and_a_raising_one_is_reported(pm):
    seen = []

    class Listener:
        @forge.hookimpl
        def forge_backend_selected(self, backend, reason):
            seen.append((backend, reason))

    class Broken:
        @forge.hookimpl
        def forge_backend_selected(self, backend):
            raise RuntimeError("listener bug")

    pm.register(Listener(), "listener")
    pm.register(Broken(), "broken")
    with pytest.warns(PluginWarning, match="listener bug"):
        name, reason = pm.select_backend(Cfg("cpu_simd"))
    assert seen == [(name, reason)]
    assert pm.infos["broken"].status == "error"


# --- the example third-party plugin (installed with pip) --------------------------------------
@pytest.fixture(scope="session")
def example_plugin():
    """The example plugin must be pip-installed: the tests prove entry-point discovery."""
    from importlib.metadata import entry_points

    try:
        import forge_plugin_example
    except ImportError:
        pytest.fail("the example plugin is not installed; run: pip install --no-deps "
                    "--no-build-isolation -e examples/forge-plugin-example")  # fmt: skip
    if not any(ep.name == "example" for ep in entry_points(group="forge")):
        pytest.fail("forge_plugin_example imports but its entry point 'example' (group forge) "
                    "is missing: reinstall it with pip")  # fmt: skip
    return forge_plugin_example


def test_example_plugin_is_discovered_through_its_entry_point(example_plugin):
    pm = quiet_create()
    info = pm.infos["example"]
    assert (info.source, info.status, info.version) == ("entrypoint", "loaded", "0.1.0")
    assert info.hooks == ["forge_register_backends", "forge_register_kernels",
                          "forge_register_samplers"]  # fmt: skip
    probe = pm.probe("example_remote")
    assert not probe.available and probe.reason == example_plugin.UNAVAILABLE_REASON
    # its score is the highest, but it is unavailable: auto must not pick it
    assert pm.select_backend(Cfg())[0] == "cpu_simd"


def test_example_kernel_wins_by_priority(example_plugin):
    pm = quiet_create()
    win = pm.kernels.get("cpu_simd", "matmul", "F32")
    assert (win.plugin, win.priority, win.impl) == ("example", 10, example_plugin.MATMUL)
    # the example registered after forge_cpu_jit at the same priority (10): it wins
    assert [k.plugin for k in pm.kernels.candidates("cpu_simd", "matmul", "F32")] == [
        "example", "forge_cpu_jit.plugin", "forge_cpu_simd.plugin"]  # fmt: skip
    # F16 has the compiled kernel (priority 10) above the NumPy one
    assert pm.kernels.get("cpu_simd", "matmul", "F16").plugin == "forge_cpu_jit.plugin"


def test_example_sampler_stage_changes_the_choice(example_plugin):
    from forge.sampling import SamplingParams, build_sampler

    pm = quiet_create()
    assert pm.samplers.get("example_invert").plugin == "example"
    logits = np.array([0.5, 3.0, -2.0, 1.0], dtype=np.float32)
    plain = build_sampler(SamplingParams(chain=["greedy"]), registry=pm.samplers)
    inverted = build_sampler(
        SamplingParams(chain=["example_invert", "greedy"]), registry=pm.samplers
    )
    assert plain.sample(logits.copy()) == 1
    assert inverted.sample(logits.copy()) == 2


@pytest.mark.parametrize("allow", ["", "something_else", "cpu_simd"])
def test_forge_plugins_can_exclude_the_example(example_plugin, monkeypatch, allow):
    monkeypatch.setenv("FORGE_PLUGINS", allow)
    pm = quiet_create()
    assert pm.infos["example"].status == "skipped"
    assert "example_remote" not in pm.backends
    assert pm.kernels.get("cpu_simd", "matmul", "F32").plugin == "forge_cpu_jit.plugin"  # built-in
    assert "cpu_simd" in pm.backends  # built-ins always load


@pytest.mark.parametrize("allow", ["example", "forge-plugin-example", " forge_plugin_example ,x"])
def test_forge_plugins_allow_list_matches_entry_point_or_distribution(example_plugin, monkeypatch,
                                                                       allow):  # fmt: skip
    monkeypatch.setenv("FORGE_PLUGINS", allow)
    pm = quiet_create(defaults=["forge_cpu_simd.plugin"])
    assert pm.infos["example"].status == "loaded"
    assert "example_remote" in pm.backends


def test_disable_entrypoints(example_plugin, monkeypatch):
    monkeypatch.setenv("FORGE_DISABLE_ENTRYPOINTS", "1")
    pm = PluginManager.create(defaults=["forge_cpu_simd.plugin"])
    assert "example" not in pm.infos and "example_remote" not in pm.backends


def test_example_kernel_is_used_by_the_cpu_runner(example_plugin, golden_dir, synthetic_golden):
    """forge.load on an F32 model runs the example's matmul, and the logits stay right."""
    import forge

    entry = synthetic_golden["llama-f32.gguf"]
    before = example_plugin.MATMUL.calls
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)
        model = forge.load(str(golden_dir / "models" / "llama-f32.gguf"), backend="cpu_simd")
    case = entry["cases"][0]
    logits = model.logits(case["tokens"])
    assert example_plugin.MATMUL.calls > before
    ref = np.asarray(case["logits"], dtype=np.float32)
    err = np.abs(logits - ref) / ref.std(axis=-1, keepdims=True)
    assert err.max() < 1e-3, f"max err {err.max():.2e}"


def test_forge_plugins_naming_a_missing_plugin_is_reported(example_plugin, monkeypatch):
    monkeypatch.setenv("FORGE_PLUGINS", "example,not_installed_anywhere")
    with pytest.warns(PluginWarning, match="named in FORGE_PLUGINS"):
        pm = PluginManager.create(defaults=["forge_cpu_simd.plugin"])
    assert pm.infos["example"].status == "loaded"
    assert pm.infos["not-installed-anywhere"].status == "error"
