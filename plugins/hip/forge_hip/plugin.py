"""The hip plugin's hook implementations (registered by forge like any third-party plugin)."""

from __future__ import annotations

from forge.hookspecs import hookimpl
from forge_hip.backend import HipBackend

FORGE_HOOK_API = 1


@hookimpl
def forge_register_backends(register) -> None:
    register(HipBackend)


@hookimpl
def forge_register_kernels(register) -> None:
    from forge_hip.library import register_builtin

    register_builtin(register)
