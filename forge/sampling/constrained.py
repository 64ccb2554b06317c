"""The ``grammar`` stage: structured output enforced while sampling, with llguidance.

`SamplingParams.constraint` (a JSON schema, any JSON object, a GBNF or Lark grammar, or a
regex) becomes an llguidance grammar; each step the stage asks llguidance which tokens may come
next and sets every other logit to ``-inf``, so every token sequence it lets through matches,
and once the grammar is complete only end-of-generation tokens remain.

Why llguidance (rather than xgrammar): a 7.6 MB wheel with no Python dependencies (xgrammar
pulls in torch, transformers and triton, over 1.3 GB), one mask in tens of microseconds on
Gemma's 262,144-token vocabulary (``benchmarks/constrained_masks.py``), and GBNF, Lark, regex
and JSON schema through one API.

The stage runs on the host: a sequence with a constraint is never greedy in the device's sense
(its chain has a stage `DeviceSampling` cannot express), so the engine samples it from the
logits row. The matcher follows the tokens the sampler's context accepts, so forced tokens
count as well; a token outside the grammar is a `ForgeRuntimeError`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from forge.errors import ConfigError, ForgeRuntimeError, UsageError
from forge.sampling.context import SamplingContext
from forge.sampling.params import Constraint, SamplingParams
from forge.sampling.select import NEG_INF

# JSON on one line, spaced as Python's json.dumps writes it: free whitespace lets a small model
# write newlines forever instead of closing the object.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def compile_grammar(constraint: Constraint) -> str:
    """The llguidance grammar of `constraint`; raises ConfigError (field ``constraint``) naming
    what is wrong with it: JSON that does not parse, a schema keyword llguidance does not
    support, a grammar or regex that does not compile."""
    from llguidance import LLMatcher, grammar_from

    kind, text = constraint.kind, constraint.text
    try:
        if kind == "json_object":
            grammar = LLMatcher.grammar_from_json_schema({"type": "object"}, JSON_OPTIONS)
        elif kind == "json_schema":
            grammar = LLMatcher.grammar_from_json_schema(_schema(text), JSON_OPTIONS)
        elif kind == "grammar":
            grammar = grammar_from("grammar", text)
        else:
            grammar = LLMatcher.grammar_from_regex(text)
    except ValueError as exc:
        raise _invalid(kind, str(exc)) from None
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise _invalid(kind, messages[0] if messages else "it does not compile")
    return grammar


def _schema(text: str) -> Any:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid("json_schema", f"the schema is not JSON: {exc}") from None
    if not isinstance(schema, (dict, bool)):
        raise _invalid("json_schema", f"a schema is an object, got {type(schema).__name__}")
    return schema


def _invalid(kind: str, why: str) -> ConfigError:
    error = ConfigError(f"invalid {kind.replace('_', ' ')} constraint: {why.strip()}")
    error.fields = ["constraint"]
    return error


class GrammarStage:
    """Masks every token the grammar does not allow next. One per sequence (it holds the
    parser state); it needs the model's tokenizer in the context (`build_sampler(tokenizer=)`)."""

    def __init__(self, grammar: str):
        self.grammar = grammar
        self._ctx: SamplingContext | None = None
        self._matcher: Any = None
        self._seen = 0  # tokens of the context the matcher has consumed
        self._bits: np.ndarray | None = None

    def __call__(self, logits: np.ndarray, ctx: SamplingContext) -> np.ndarray:
        if ctx is not self._ctx:
            self._start(ctx)
        matcher = self._matcher
        new = ctx.tokens[self._seen :]
        if new:
            if not matcher.consume_tokens(new):
                raise ForgeRuntimeError(
                    f"a token outside the grammar was taken: {matcher.get_error()}"
                )
            self._seen += len(new)
        matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if matcher.is_error():
            raise ForgeRuntimeError(f"the grammar cannot go on: {matcher.get_error()}")
        n = min(logits.size, self._n_vocab)
        allowed = np.unpackbits(self._bits.view(np.uint8), count=n, bitorder="little")
        logits[:n][allowed == 0] = NEG_INF
        logits[n:] = NEG_INF  # rows past the tokenizer's vocabulary are never text
        return logits

    def _start(self, ctx: SamplingContext) -> None:
        from llguidance import LLMatcher

        from forge.sampling.grammar_vocab import llg_tokenizer

        if ctx.tokenizer is None:
            raise UsageError(
                "the grammar stage needs the model's tokenizer: build the sampler with "
                "build_sampler(..., tokenizer=model.tokenizer)"
            )
        vocab = llg_tokenizer(ctx.tokenizer)
        self._matcher = LLMatcher(vocab, self.grammar, log_level=0)
        if self._matcher.is_error():
            raise ForgeRuntimeError(f"the grammar does not compile: {self._matcher.get_error()}")
        self._n_vocab = vocab.vocab_size
        self._bits = np.zeros((self._n_vocab + 31) // 32, dtype=np.int32)
        self._ctx, self._seen = ctx, ctx.prompt_len


def grammar(params: SamplingParams) -> GrammarStage | None:
    """The stage factory: inactive without a constraint; compiles (and so checks) it once."""
    if params.constraint is None:
        return None
    return GrammarStage(compile_grammar(params.constraint))
