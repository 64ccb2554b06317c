"""Backend selection: from the configured name (or "auto") and the probes to one backend.

Functions over probe results, so the rules are easy to read and test; the plugin manager
supplies the probes, logs the returned reason and calls the ``forge_backend_selected`` hook.
The reason is one short line; why the other backends are unavailable goes to the debug log
(``--log-level debug``), and ``forge backends`` shows it too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from forge.devices import BackendProbe
from forge.errors import BackendUnavailableError

Probe = Callable[[str], BackendProbe]
log = logging.getLogger("forge")


def choose(wanted: str, device: int, names: Sequence[str], probe: Probe) -> tuple[str, str]:
    """(backend, reason) for one configured name; BackendUnavailableError with the probe's reason.

    ``wanted == "auto"`` picks the available backend with the highest score (the earlier
    registered one on ties); any other name must be available and have device `device`.
    """
    if wanted != "auto":
        found = probe(wanted)
        if not found.available:
            raise BackendUnavailableError(wanted, found.reason or "its probe reports no reason")
        if found.devices and device >= len(found.devices):
            raise BackendUnavailableError(
                wanted, f"device {device} requested but it has {len(found.devices)} device(s)"
            )
        return wanted, f"using backend {wanted!r} as configured{_where(found, device)}"
    probes = {name: probe(name) for name in names}
    usable = [(p.score, -i, n) for i, (n, p) in enumerate(probes.items()) if p.available]
    down = [f"{n} ({p.reason})" for n, p in probes.items() if not p.available]
    if not usable:
        why = "no backend is available: " + "; ".join(down) if down else "no backend is registered"
        raise BackendUnavailableError("auto", why)
    score, _, name = max(usable)
    best = probes[name]
    reason = f"auto picked backend {name!r} (highest score {score}){_where(best, device)}"
    on_cpu = bool(best.devices) and all(d.platform == "cpu" for d in best.devices)
    if down:
        log.debug("unavailable backends: %s", "; ".join(down))
    if down and on_cpu:
        reason += "; fell back to the CPU (`forge backends` says why the others are unavailable)"
    return name, reason


def choose_with_fallback(
    wanted: str, fallback: str | None, device: int, names: Sequence[str], probe: Probe
) -> tuple[str, str, bool]:
    """Like `choose`, then `fallback` (a name or "auto") if `wanted` is unavailable.

    Returns (backend, reason, fell_back). Raises BackendUnavailableError naming both reasons
    when the fallback is unavailable too.
    """
    try:
        return (*choose(wanted, device, names, probe), False)
    except BackendUnavailableError as err:
        if not fallback or fallback == wanted:
            raise
        try:
            name, _ = choose(fallback, device, names, probe)
        except BackendUnavailableError as err2:
            raise BackendUnavailableError(
                wanted, f"{err.reason}; the fallback {fallback!r} is unavailable too: {err2.reason}"
            ) from err
        reason = (
            f"backend {wanted!r} is unavailable ({err.reason}); falling back to {name!r} "
            f"as configured (fallback = {fallback!r})"
        )
        return name, reason, True


def _where(probe: BackendProbe, device: int) -> str:
    if device < len(probe.devices):
        d = probe.devices[device]
        return f" on {d.name} ({d.platform}, {d.arch})"
    return ""
