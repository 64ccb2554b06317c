"""Sampling: turning a step's logits into the next token.

A sampler is a chain of named *stages* followed by one *sampler* (the picker). Stages rewrite a
float32 copy of the logits (masking with ``-inf`` or rescaling); the picker chooses the token.
Every name comes from `SamplerRegistry`, filled through the ``forge_register_samplers`` hook;
the built-ins (`forge.sampling.builtin`) register through that same hook.

Default chain (`DEFAULT_CHAIN`), each stage skipped when its parameters make it a no-op:

0. ``grammar``     mask every token ``params.constraint`` (JSON schema, grammar, regex) does
                   not allow next (`forge.sampling.constrained`); always runs when set
1. ``logit_bias``  add ``params.logit_bias[token]`` to those logits (``-inf`` bans)
2. ``penalties``   repetition (llama.cpp), presence and frequency (OpenAI) over the last
                   ``repeat_last_n`` tokens
3. ``top_k``       keep the ``top_k`` highest logits (and ties with the k-th)
4. ``top_p``       keep the smallest most-probable set with mass >= ``top_p`` (and ties)
5. ``min_p``       keep tokens with p >= ``min_p`` * max p
6. ``temperature`` divide by ``temperature``
7. picker          ``dist`` (draw from the softmax with the context's seeded RNG), or
                   ``greedy`` (argmax, lowest id among ties) when ``temperature == 0``; the
                   greedy default chain runs only ``grammar``, ``logit_bias`` and
                   ``penalties`` since the other stages cannot change the argmax.

``params.chain`` replaces the order: a list of names, optionally ending with a sampler name.

Usage::

    sampler = build_sampler(SamplingParams(temperature=0.7, seed=1), tokens=prompt_ids)
    token = sampler.sample(logits)   # logits: float32 [n_vocab]
    sampler.accept(token)
"""

from forge.sampling.chain import (
    DEFAULT_CHAIN,
    DEFAULT_PICKER,
    GREEDY_CHAIN,
    GREEDY_PICKER,
    Sampler,
    build_sampler,
)
from forge.sampling.context import SamplingContext
from forge.sampling.params import SamplingParams
from forge.sampling.registry import SamplerEntry, SamplerRegistry, default_registry

__all__ = [
    "DEFAULT_CHAIN", "DEFAULT_PICKER", "GREEDY_CHAIN", "GREEDY_PICKER", "Sampler",
    "SamplerEntry", "SamplerRegistry", "SamplingContext", "SamplingParams", "build_sampler",
    "default_registry",
]  # fmt: skip
