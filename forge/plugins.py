"""The plugin manager: discovery, registration, probing and backend selection.

Plugins come from two places and go through the same path:
- the default plugins (`DEFAULT_PLUGINS`), imported by module name;
- third-party plugins, from the entry-point group ``forge``.

Environment:
- ``FORGE_PLUGINS=a,b``: load only these third-party plugins (matched against the entry-point
  name or the distribution name). The default plugins always load: they are part of forge and
  cpu_simd is the fallback of last resort. ``FORGE_PLUGINS=`` (empty) loads no third-party plugin.
- ``FORGE_DISABLE_ENTRYPOINTS=1``: load no third-party plugin at all.

A plugin that fails to import, declares another hook API version (``FORGE_HOOK_API``), or whose
hook raises is never dropped silently: it gets a `PluginInfo` with the error (shown by
``forge plugins``) and a `PluginWarning`. A hook that raises contributes nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import logging
import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pluggy

from forge import hookspecs
from forge.backend import Backend
from forge.devices import BackendProbe
from forge.errors import BackendUnavailableError
from forge.kernels import ANY_TYPE, KernelSpec, KernelTable
from forge.selection import choose_with_fallback

if TYPE_CHECKING:
    from forge.sampling import SamplerRegistry

log = logging.getLogger("forge")

DEFAULT_PLUGINS = (
    "forge_cpu_simd.plugin",
    "forge_cpu_jit.plugin",
    "forge_hip.plugin",
    "forge.sampling.builtin",
)
ENTRY_POINT_GROUP = "forge"


class PluginWarning(UserWarning):
    """A plugin could not be loaded or one of its hooks failed."""


@dataclass
class PluginInfo:
    """One plugin as `forge plugins` shows it."""

    name: str  # module name (default plugins) or entry-point name
    source: str  # "default", "entrypoint" or "inline"
    version: str = ""  # distribution version ("" when unknown)
    status: str = "loaded"  # "loaded", "error" or "skipped"
    hooks: list[str] = field(default_factory=list)  # hook names it implements
    errors: list[str] = field(default_factory=list)  # what went wrong, for users


def _kernel_call(backend, op, weight_type=ANY_TYPE, impl=None, priority=0):  # noqa: ANN001
    return backend, op, weight_type, impl, priority


def _parse_allow_list(value: str | None) -> set[str] | None:
    if value is None:
        return None
    return {n.strip().lower().replace("_", "-") for n in value.split(",") if n.strip()}


class PluginManager:
    """Holds the pluggy manager and what the plugins registered."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self._collected: dict[str, Any] | None = None
        self._instances: dict[str, Backend] = {}
        self._probes: dict[str, BackendProbe] = {}

    # --- loading ---------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        *,
        defaults: Iterable[str] = DEFAULT_PLUGINS,
        entrypoints: bool | None = None,
        allow: str | None = None,
    ) -> PluginManager:
        """A manager with the default plugins and (unless disabled) the entry-point plugins.

        `entrypoints` and `allow` default to the FORGE_DISABLE_ENTRYPOINTS and FORGE_PLUGINS
        environment variables.
        """
        manager = cls()
        for module in defaults:
            manager.load_module(module)
        if entrypoints is None:
            entrypoints = os.environ.get("FORGE_DISABLE_ENTRYPOINTS", "") in ("", "0")
        if entrypoints:
            manager.load_entrypoints(
                allow if allow is not None else os.environ.get("FORGE_PLUGINS")
            )
        return manager

    def load_module(self, module: str) -> None:
        """Import a default plugin module by name and register it."""
        from forge import __version__

        try:
            plugin = importlib.import_module(module)
        except Exception as exc:  # any import-time failure is reported, not raised
            self._fail(PluginInfo(module, "default", __version__), f"import failed: {_exc(exc)}")
            return
        self.register(plugin, module, source="default", version=__version__)

    def load_entrypoints(self, allow: str | None = None) -> None:
        """Load the plugins of the entry-point group ``forge``, restricted to `allow` if given."""
        wanted = _parse_allow_list(allow)
        seen: set[str] = set()
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = getattr(ep, "dist", None)
            dist_name = dist.metadata["Name"] if dist is not None else ""
            version = dist.version if dist is not None else ""
            keys = {ep.name.lower().replace("_", "-"), dist_name.lower().replace("_", "-")}
            if wanted is not None and not keys & wanted:
                info = PluginInfo(ep.name, "entrypoint", version, status="skipped")
                info.errors.append("not listed in FORGE_PLUGINS")
                self.infos[ep.name] = info
                continue
            seen |= keys
            try:
                plugin = ep.load()
            except Exception as exc:
                info = PluginInfo(ep.name, "entrypoint", version)
                self._fail(info, f"import of {ep.value} failed: {_exc(exc)}")
                continue
            self.register(plugin, ep.name, source="entrypoint", version=version)
        for missing in sorted((wanted or set()) - seen):
            self._fail(
                PluginInfo(missing, "entrypoint"),
                "named in FORGE_PLUGINS but no installed plugin has this name",
            )

    def register(
        self, plugin: Any, name: str | None = None, *, source: str = "inline", version: str = ""
    ) -> PluginInfo:
        """Register a plugin object or module (checking its FORGE_HOOK_API); returns its info."""
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        info = PluginInfo(name, source, version)
        declared = getattr(plugin, "FORGE_HOOK_API", None)
        if declared is not None and _major(declared) != hookspecs.HOOK_API_VERSION:
            return self._fail(
                info,
                f"written for hook API {declared}, this forge provides "
                f"{hookspecs.HOOK_API_VERSION}",
            )
        try:
            self.pm.register(plugin, name)
        except Exception as exc:  # pluggy.PluginValidationError, duplicate name, ...
            return self._fail(info, f"registration failed: {_exc(exc)}")
        self._attribute(plugin, name)
        info.hooks = sorted(c.name for c in self.pm.get_hookcallers(plugin) or [])
        for hook in info.hooks:
            if getattr(self.pm.hook, hook).spec is None:
                self._fail(info, f"implements unknown hook {hook!r}")
        self.infos[name] = info
        self._invalidate()
        return info

    def unregister(self, name: str) -> None:
        """Remove a plugin (tests register throwaway plugins and remove them again)."""
        if self.pm.get_plugin(name) is not None:
            self.pm.unregister(name=name)
        self.infos.pop(name, None)
        self._invalidate()

    def _fail(self, info: PluginInfo, message: str) -> PluginInfo:
        info.status = "error"
        info.errors.append(message)
        self.infos.setdefault(info.name, info)
        warnings.warn(f"forge plugin {info.name!r}: {message}", PluginWarning, stacklevel=3)
        return info

    def _invalidate(self) -> None:
        self._collected = None
        self._instances.clear()
        self._probes.clear()

    @property
    def load_errors(self) -> dict[str, list[str]]:
        return {n: i.errors for n, i in self.infos.items() if i.status == "error"}

    # --- collection ------------------------------------------------------------------------
    def _run_hook(self, hook_name: str, **kwargs: Any) -> list[tuple[str, tuple, dict]]:
        """Call one hook through pluggy (its ordering, `tryfirst`/`trylast`, wrappers and
        results as pluggy documents them), charging a failure to the plugin that raised.

        `_attribute` wraps every hook implementation at registration: while it runs, the
        `register` callback given here knows whose calls it receives, and an implementation
        that raises is reported and contributes nothing (its register calls are dropped; the
        other plugins' hooks still run). Returns (plugin name, args, kwargs) per register call,
        in registration order: pluggy calls the last registered plugin (or a `tryfirst` one)
        first, so the plugins' blocks of calls are reversed, and a later plugin's registrations
        come after (and win ties over) an earlier one's.
        """
        blocks: list[tuple[str, list[tuple[str, tuple, dict]]]] = []

        def register(*args: Any, **kw: Any) -> None:
            plugin = _CURRENT_PLUGIN.get()
            if not blocks or blocks[-1][0] != plugin:
                blocks.append((plugin, []))
            blocks[-1][1].append((plugin, args, kw))

        failed: list[str] = []
        token = _FAILED.set(failed)
        try:
            getattr(self.pm.hook, hook_name)(**{**kwargs, "register": register})
        except Exception as exc:  # a wrapper that raised: pluggy ends the call with it
            plugin = getattr(exc, _FORGE_PLUGIN, "")
            failed.append(plugin)
            self._plugin_error(plugin, f"hook {hook_name} raised {_exc(exc)}")
        finally:
            _FAILED.reset(token)
        return [c for plugin, calls in reversed(blocks) if plugin not in failed for c in calls]

    def _attribute(self, plugin: Any, name: str) -> None:
        """Wrap `plugin`'s hook implementations (see `_run_hook`)."""
        for caller in self.pm.get_hookcallers(plugin) or []:
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin:
                    impl.function = _attributed(impl.function, name, caller.name, self,
                                                impl.wrapper or impl.hookwrapper)  # fmt: skip

    def _plugin_error(self, plugin: str, message: str) -> None:
        info = self.infos.setdefault(plugin, PluginInfo(plugin, "inline"))
        self._fail(info, message)

    def _collect(self) -> dict[str, Any]:
        if self._collected is not None:
            return self._collected
        backends: dict[str, type[Backend]] = {}
        owners: dict[str, str] = {}
        for plugin, args, kw in self._run_hook("forge_register_backends"):
            cls = args[0] if args else kw.get("backend")
            name = getattr(cls, "name", None)
            if not (isinstance(cls, type) and issubclass(cls, Backend) and isinstance(name, str)):
                self._plugin_error(
                    plugin, f"registered {cls!r}, not a Backend subclass with a name"
                )
            elif name in backends:
                self._plugin_error(
                    plugin,
                    f"backend name {name!r} is already registered by plugin {owners[name]!r}",
                )
            else:
                backends[name], owners[name] = cls, plugin
        kernels = KernelTable()
        for plugin, args, kw in self._run_hook("forge_register_kernels"):
            try:
                backend, op, wtype, impl, priority = _kernel_call(*args, **kw)
            except TypeError as exc:
                self._plugin_error(plugin, f"bad kernel registration: {exc}")
                continue
            kernels.add(KernelSpec(backend, op, wtype, impl, int(priority), plugin))
        from forge.sampling import SamplerRegistry

        samplers = SamplerRegistry()
        for plugin, args, kw in self._run_hook("forge_register_samplers"):
            try:
                samplers.register_callback(plugin)(*args, **kw)
            except Exception as exc:  # PluginError (taken name, bad kind) or a bad call
                self._plugin_error(plugin, f"bad sampler registration: {exc}")
        self._collected = {
            "backends": backends,
            "owners": owners,
            "kernels": kernels,
            "samplers": samplers,
        }
        return self._collected

    @property
    def backends(self) -> dict[str, type[Backend]]:
        """Backend classes by name, in registration order."""
        return self._collect()["backends"]

    def backend_plugin(self, name: str) -> str:
        """The plugin that registered backend `name`."""
        return self._collect()["owners"][name]

    @property
    def kernels(self) -> KernelTable:
        """Every registered kernel; `KernelSpec.plugin` names who registered it."""
        return self._collect()["kernels"]

    @property
    def samplers(self) -> SamplerRegistry:
        """A `forge.sampling.SamplerRegistry` with every stage and sampler plugins registered."""
        return self._collect()["samplers"]

    # --- probing and selection ------------------------------------------------------------
    def backend(self, name: str) -> Backend:
        """The (cached) instance of backend `name`; BackendUnavailableError if none has it."""
        if name not in self._instances:
            if name not in self.backends:
                raise BackendUnavailableError(name, self._unknown_reason(name))
            self._instances[name] = self.backends[name]()
        return self._instances[name]

    def probe(self, name: str, *, refresh: bool = False) -> BackendProbe:
        """Probe one backend. Never raises: a probe that raises becomes available=False."""
        if refresh or name not in self._probes:
            try:
                result = self.backend(name).probe()
                if not isinstance(result, BackendProbe):
                    result = BackendProbe(
                        False, f"probe returned {type(result).__name__}, not a BackendProbe"
                    )
            except BackendUnavailableError as exc:
                result = BackendProbe(False, exc.reason)
            except Exception as exc:  # a buggy probe must not take forge down
                result = BackendProbe(False, f"probe raised {_exc(exc)}")
            self._probes[name] = result
        return self._probes[name]

    def probe_all(self, *, refresh: bool = False) -> dict[str, BackendProbe]:
        return {name: self.probe(name, refresh=refresh) for name in self.backends}

    def select_backend(self, config: Any) -> tuple[str, str]:
        """Choose the backend for `config` (uses .backend, .fallback, .device).

        Returns (backend name, reason) and logs one line saying what was picked and why.
        Raises BackendUnavailableError (with the probe's reason) when the named backend cannot
        run and no usable fallback is configured.
        """
        wanted = getattr(config, "backend", "auto") or "auto"
        fallback = getattr(config, "fallback", None)
        device = int(getattr(config, "device", 0) or 0)
        name, reason, fell_back = choose_with_fallback(
            wanted, fallback, device, list(self.backends), self.probe
        )
        log.log(logging.WARNING if fell_back else logging.INFO, "%s", reason)
        self.notify("forge_backend_selected", backend=name, reason=reason)
        return name, reason

    def _unknown_reason(self, name: str) -> str:
        known = ", ".join(self.backends) or "none"
        reason = f"no plugin registers a backend named {name!r} (known: {known})"
        if self.load_errors:
            reason += "; plugins with load errors: " + ", ".join(self.load_errors)
        return reason

    def notify(self, hook_name: str, **kwargs: Any) -> None:
        """Call a lifecycle hook on every plugin; a plugin that raises is reported, not fatal."""
        self._run_hook(hook_name, **kwargs)


_CURRENT_PLUGIN: contextvars.ContextVar[str] = contextvars.ContextVar("forge_plugin", default="")
_FAILED: contextvars.ContextVar[list[str]] = contextvars.ContextVar("forge_failed")


@contextlib.contextmanager
def _charged_to(plugin: str) -> Iterator[None]:
    """Run with `_CURRENT_PLUGIN` set; an error leaving it names the plugin (`_FORGE_PLUGIN`)
    unless an inner one already did."""
    token = _CURRENT_PLUGIN.set(plugin)
    try:
        yield
    except BaseException as exc:
        if not isinstance(exc, StopIteration | GeneratorExit) and not hasattr(exc, _FORGE_PLUGIN):
            setattr(exc, _FORGE_PLUGIN, plugin)
        raise
    finally:
        _CURRENT_PLUGIN.reset(token)


_FORGE_PLUGIN = "_forge_plugin"


def _attributed(function: Any, plugin: str, hook: str, manager: PluginManager, wrapper: bool):
    """`function` (a hook implementation of `plugin`) run with `_CURRENT_PLUGIN` set to the
    plugin; a plain implementation that raises is reported and returns None, so pluggy goes on
    with the next one. A wrapper's generator keeps pluggy's semantics (its error ends the call,
    reported by `_run_hook`)."""
    if wrapper:

        @functools.wraps(function)
        def wrapped_gen(*args: Any, **kwargs: Any) -> Any:
            with _charged_to(plugin):
                gen = function(*args, **kwargs)
                step = next(gen)
            while True:
                try:
                    sent = yield step
                except BaseException as exc:
                    resume, value = gen.throw, exc
                else:
                    resume, value = gen.send, sent
                try:
                    with _charged_to(plugin):
                        step = resume(value)
                except StopIteration as stop:  # the wrapper returned (its result for pluggy)
                    return stop.value

        return wrapped_gen

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        token = _CURRENT_PLUGIN.set(plugin)
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            failed = _FAILED.get(None)
            if failed is None:  # called outside _run_hook (pm.hook.<name>(...) directly)
                raise
            failed.append(plugin)
            manager._plugin_error(plugin, f"hook {hook} raised {_exc(exc)}")
            return None
        finally:
            _CURRENT_PLUGIN.reset(token)

    return wrapped


def _major(version: Any) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def _exc(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


_default: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide manager, created on first use from the environment."""
    global _default
    if _default is None:
        _default = PluginManager.create()
    return _default


def reset_plugin_manager() -> None:
    """Forget the process-wide manager (the next call re-reads the environment)."""
    global _default
    _default = None


def select_backend(config: Any) -> tuple[str, str]:
    """`PluginManager.select_backend` on the process-wide manager."""
    return get_plugin_manager().select_backend(config)
