"""`build_sampler`: a chain of named stages ending with a picker, built from `SamplingParams`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any

import numpy as np

from forge.errors import ConfigError, ForgeError, PluginError, UsageError
from forge.sampling.context import SamplingContext
from forge.sampling.params import SamplingParams
from forge.sampling.pickers import check_top
from forge.sampling.registry import SamplerEntry, SamplerRegistry, default_registry

DEFAULT_CHAIN = ("grammar", "logit_bias", "penalties", "top_k", "top_p", "min_p", "temperature")
DEFAULT_PICKER = "dist"  # when temperature > 0
GREEDY_PICKER = "greedy"  # when temperature == 0
GRAMMAR_STAGE = "grammar"  # enforces params.constraint (forge.sampling.constrained)
# With the greedy picker the truncation stages and temperature cannot change which token has
# the highest logit (each keeps the maximum and its ties), so the default greedy chain skips them.
GREEDY_CHAIN = ("grammar", "logit_bias", "penalties")

Stage = Callable[[np.ndarray, SamplingContext], np.ndarray]
Picker = Callable[[np.ndarray, SamplingContext], int]


class Sampler:
    """A built chain: ``sample(logits)`` runs the active stages and the picker.

    The sampler owns a `SamplingContext` (``ctx``) seeded from ``params.seed``; ``sample`` and
    ``accept`` use it unless another context is passed. ``sample`` does not record the token:
    call ``accept`` with the token actually used, so forced tokens count for penalties too.
    """

    def __init__(
        self,
        params: SamplingParams,
        stages: list[tuple[str, Stage]],
        picker: tuple[str, Picker],
        ctx: SamplingContext,
    ) -> None:
        self.params = params
        self.stages = stages
        self.picker = picker
        self.ctx = ctx

    @property
    def chain(self) -> list[str]:
        """Names of what runs, in order: the active stages, then the picker."""
        return [name for name, _ in self.stages] + [self.picker[0]]

    def sample(self, logits: np.ndarray, ctx: SamplingContext | None = None) -> int:
        """Pick the next token from ``logits`` (``[n_vocab]``, left unchanged)."""
        ctx = self.ctx if ctx is None else ctx
        work = np.array(logits, dtype=np.float32)  # always a copy: stages work in place
        if work.ndim != 1 or work.size == 0:
            raise UsageError(f"sample() wants logits of shape [n_vocab], got {work.shape}")
        check_top(float(work.max()))  # NaN, +inf or all -inf: no stage could recover
        for name, stage in self.stages:
            out = stage(work, ctx)
            if out is not work and (not isinstance(out, np.ndarray) or out.shape != work.shape):
                raise PluginError(
                    f"sampler stage {name!r} returned {type(out).__name__} "
                    f"of shape {getattr(out, 'shape', None)}, not {work.shape}"
                )
            work = out
        token = self.picker[1](work, ctx)
        if not 0 <= token < work.size:
            raise PluginError(
                f"sampler {self.picker[0]!r} picked token {token} outside "
                f"the vocabulary of {work.size}"
            )
        return int(token)

    def accept(self, token: int, ctx: SamplingContext | None = None) -> None:
        """Record the token used for this sequence (it then counts for the penalties)."""
        (self.ctx if ctx is None else ctx).accept(token)

    def reset(self, tokens: Iterable[int] = ()) -> None:
        """Start a new sequence: a fresh context with ``tokens`` and the same seed."""
        self.ctx = SamplingContext(tokens, self.params.seed, self.ctx.tokenizer)


@lru_cache(maxsize=1)
def _builtin_registry() -> SamplerRegistry:
    return default_registry()


def build_sampler(
    params: SamplingParams | Mapping[str, Any] | None = None,
    registry: SamplerRegistry | None = None,
    tokens: Iterable[int] = (),
    tokenizer: Any = None,
) -> Sampler:
    """Build the sampler for ``params`` from the stages and samplers in ``registry``.

    :param params: a `SamplingParams`, a mapping validated into one, or None for defaults.
    :param registry: where names are looked up; None means the built-ins only.
    :param tokens: the prompt tokens the sampler's context starts with (seen by penalties).
    :param tokenizer: the model's tokenizer, for stages that read token texts (``grammar``).
    A ``params.constraint`` always runs: a chain that does not name ``grammar`` gets it first.
    :raises ConfigError: unknown names in ``params.chain`` (the error lists the known ones),
        a sampler anywhere but last, or invalid params.
    :raises PluginError: a factory failed or returned something unusable.
    """
    if not isinstance(params, SamplingParams):
        params = SamplingParams.model_validate(dict(params or {}))
    registry = _builtin_registry() if registry is None else registry
    if params.chain is not None:
        names = list(params.chain)
    elif params.temperature == 0.0:
        names = list(GREEDY_CHAIN)
    else:
        names = list(DEFAULT_CHAIN)
    if params.constraint is not None and GRAMMAR_STAGE not in names:
        names.insert(0, GRAMMAR_STAGE)
    entries = [_lookup(registry, name) for name in names]
    for pos, entry in enumerate(entries[:-1]):
        if entry.kind == "sampler":
            raise ConfigError(
                f"sampler {entry.name!r} must be last in the chain, found at position {pos}"
            )
    if not entries or entries[-1].kind != "sampler":
        default = GREEDY_PICKER if params.temperature == 0.0 else DEFAULT_PICKER
        entries.append(_lookup(registry, default))
    stages = []
    for entry in entries[:-1]:
        stage = _make(entry, params)
        if stage is not None:
            stages.append((entry.name, stage))
    picker = _make(entries[-1], params)
    if picker is None:
        raise PluginError(
            f"sampler {entries[-1].name!r} (plugin {entries[-1].plugin!r}) "
            "returned None from its factory"
        )
    ctx = SamplingContext(tokens, params.seed, tokenizer)
    return Sampler(params, stages, (entries[-1].name, picker), ctx)


def _lookup(registry: SamplerRegistry, name: str) -> SamplerEntry:
    entry = registry.get(name)
    if entry is None:
        raise ConfigError(
            f"unknown sampler stage {name!r} in the chain; known: {', '.join(registry.names())}"
        )
    return entry


def _make(entry: SamplerEntry, params: SamplingParams) -> Any:
    try:
        made = entry.factory(params)
    except ForgeError:
        raise
    except Exception as exc:
        raise PluginError(
            f"sampler {entry.kind} {entry.name!r} (plugin {entry.plugin!r}) failed to build: "
            f"{exc!r}"
        ) from exc
    if made is not None and not callable(made):
        raise PluginError(
            f"sampler {entry.kind} {entry.name!r} (plugin {entry.plugin!r}) "
            f"built a {type(made).__name__}, which is not callable"
        )
    return made
