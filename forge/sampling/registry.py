"""`SamplerRegistry`: every stage and sampler that plugins registered, by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pluggy

from forge.errors import ForgeError, PluginError

KINDS = ("stage", "sampler")


@dataclass(frozen=True)
class SamplerEntry:
    """One registration made through ``forge_register_samplers``."""

    name: str  # the name chains refer to
    kind: str  # "stage" (rewrites logits) or "sampler" (picks the token)
    factory: Callable[[Any], Any]  # factory(params) -> stage/sampler (stages: None if inactive)
    plugin: str  # name of the plugin that registered it


class SamplerRegistry:
    """Names -> (kind, factory, plugin). Names are unique across stages and samplers."""

    def __init__(self) -> None:
        self._entries: dict[str, SamplerEntry] = {}

    def register(
        self, name: str, factory: Callable[[Any], Any], kind: str = "stage", *, plugin: str = ""
    ) -> None:
        """Add one entry; a bad kind, a non-callable factory or a taken name is a PluginError."""
        who = f"plugin {plugin!r}" if plugin else "a plugin"
        if not isinstance(name, str) or not name:
            raise PluginError(f"{who} registered a sampler with an invalid name {name!r}")
        if kind not in KINDS:
            raise PluginError(
                f"{who} registered {name!r} with unknown kind {kind!r} (expected one of {KINDS})"
            )
        if not callable(factory):
            raise PluginError(f"{who} registered {name!r} with a factory that is not callable")
        if name in self._entries:
            first = self._entries[name].plugin or "an earlier plugin"
            raise PluginError(f"{who} registered {name!r}, already registered by {first!r}")
        self._entries[name] = SamplerEntry(name, kind, factory, plugin)

    def register_callback(self, plugin: str) -> Callable[..., None]:
        """The ``register`` argument to pass to one plugin's hook implementation."""

        def register(name: str, factory: Callable[[Any], Any], kind: str = "stage") -> None:
            self.register(name, factory, kind, plugin=plugin)

        return register

    def collect(self, pm: pluggy.PluginManager) -> SamplerRegistry:
        """Call every plugin's ``forge_register_samplers``, in registration order; returns self.

        Each implementation is called on its own so that entries (and errors) name their plugin.
        """
        for impl in pm.hook.forge_register_samplers.get_hookimpls():
            if impl.hookwrapper or impl.wrapper:
                continue
            register = self.register_callback(impl.plugin_name)
            kwargs = {"register": register} if "register" in impl.argnames else {}
            try:
                impl.function(**kwargs)
            except ForgeError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"plugin {impl.plugin_name!r} failed in forge_register_samplers: {exc!r}"
                ) from exc
        return self

    def get(self, name: str) -> SamplerEntry | None:
        return self._entries.get(name)

    def names(self, kind: str | None = None) -> list[str]:
        """Sorted names, optionally only those of one kind."""
        return sorted(n for n, e in self._entries.items() if kind is None or e.kind == kind)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)


def default_registry() -> SamplerRegistry:
    """A fresh registry holding only the built-ins, loaded through the hook like any plugin."""
    import forge.hookspecs
    from forge.sampling import builtin

    pm = pluggy.PluginManager(forge.hookspecs.PROJECT)
    pm.add_hookspecs(forge.hookspecs)
    pm.register(builtin)
    return SamplerRegistry().collect(pm)
