"""The built-in stages and samplers, registered through the hook like any plugin's.

The plugin manager registers this module as a default plugin.
"""

from __future__ import annotations

from collections.abc import Callable

from forge.hookspecs import hookimpl
from forge.sampling import constrained, pickers, stages


@hookimpl
def forge_register_samplers(register: Callable[..., None]) -> None:
    register("grammar", constrained.grammar)
    register("logit_bias", stages.logit_bias)
    register("penalties", stages.penalties)
    register("top_k", stages.top_k)
    register("top_p", stages.top_p)
    register("min_p", stages.min_p)
    register("temperature", stages.temperature)
    register("greedy", pickers.greedy, kind="sampler")
    register("dist", pickers.dist, kind="sampler")
