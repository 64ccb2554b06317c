"""The forge plugin API: hook specifications.

A plugin is a module or object with functions named like the hooks below and marked with
`forge.hookimpl`. Built-in plugins (cpu_simd, hip) are registered exactly like third-party ones,
which come from the entry-point group ``forge``. A plugin may declare the hook API version it was
written for as a module attribute ``FORGE_HOOK_API = <int>``; the manager refuses a plugin whose
major version differs from `HOOK_API_VERSION` and reports it in ``forge plugins``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

HOOK_API_VERSION = 1
PROJECT = "forge"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def forge_register_backends(register: Callable[[type], None]) -> None:
    """Register backend classes.

    :param register: call ``register(BackendClass)`` once per backend. ``BackendClass`` subclasses
        `forge.backend.Backend`: it has a unique ``name``, a ``probe()`` that never raises, and
        ``open_runner(...)`` that places a model on a device.

    Called once per plugin manager. Registering two backends with the same name is an error
    reported against the second plugin.
    """


@hookspec
def forge_register_kernels(register: Callable[..., None]) -> None:
    """Register kernel implementations.

    :param register: call ``register(backend, op, weight_type, impl, priority=0)``.
        ``backend`` is a backend name, ``op`` an op name ("matmul", "rms_norm", ...),
        ``weight_type`` a GGML type name ("Q4_K") or ``"*"`` for any type, ``impl`` whatever the
        backend expects for that op (its docs say), ``priority`` an int: for one
        (backend, op, weight_type) the highest priority wins, so a plugin can replace a built-in
        kernel by registering with a higher priority. Built-in kernels use priority 0.

    Each backend documents its op vocabulary (the op names it looks up, the ``impl`` each takes,
    the weight layout it hands a kernel) where it registers its own kernels: the module
    docstrings of ``forge_cpu_simd.plugin`` and ``forge_hip.plugin``.
    """


@hookspec
def forge_register_samplers(register: Callable[..., None]) -> None:
    """Register sampler stages and whole samplers.

    :param register: call ``register(name, factory, kind="stage")``.
        ``kind="stage"``: ``factory(params: SamplingParams) -> Stage | None``; a stage is a callable
        ``stage(logits: ndarray[float32], ctx: SamplingContext) -> ndarray`` that returns filtered
        or rescaled logits (masked entries set to ``-inf``); returning None from the factory means
        the stage is inactive for these parameters.
        ``kind="sampler"``: ``factory(params) -> Sampler``, a callable
        ``sampler(logits, ctx) -> int`` that picks the token itself.
        The chain that runs is built from names (see `forge.sampling`).
    """


@hookspec
def forge_backend_selected(backend: str, reason: str) -> None:
    """Called after backend selection with the chosen backend's name and why it was chosen."""


@hookspec
def forge_model_loaded(model: Any) -> None:
    """Called after a model is loaded and ready (``model`` is a `forge.Model`)."""
