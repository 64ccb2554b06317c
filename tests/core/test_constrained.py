"""Structured output: the ``grammar`` stage against independent references (json, jsonschema,
re), with random logits on a tiny vocabulary and with the default model."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from forge.errors import ConfigError, UsageError
from forge.generation import SequenceState
from forge.gguf import open_gguf
from forge.sampling import SamplingParams, build_sampler
from forge.sampling.constrained import compile_grammar
from forge.sampling.params import Constraint
from forge.tokenizer import tokenizer_from_metadata

# A schema whose language is finite (bounded strings, numbers, arrays and whitespace): every
# path through it ends, so a long enough generation always completes it.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer(golden_dir):
    """A 535-token SentencePiece vocabulary with byte fallback (every byte can be spelled)."""
    path = golden_dir / "models" / "llama-f32.gguf"
    return tokenizer_from_metadata(open_gguf(str(path)).metadata)


def generate_random(tokenizer, constraint: dict, seed: int, max_tokens: int = 400) -> SequenceState:
    """A sequence sampled at temperature 1.5 from random logits: only the grammar shapes it."""
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed,
                            constraint=constraint)  # fmt: skip
    sampler = build_sampler(params, tokens=[1], tokenizer=tokenizer)
    state = SequenceState([1], tokenizer, sampler, max_tokens=max_tokens, n_ctx=4096)
    rng = np.random.default_rng(seed)
    while not state.finished:
        state.step(rng.normal(0, 3, tokenizer.n_vocab).astype(np.float32))
    return state


@pytest.mark.parametrize("seed", range(6))
def test_random_logits_always_give_a_valid_document(tokenizer, seed):
    state = generate_random(tokenizer, {"kind": "json_schema", "text": json.dumps(PERSON)}, seed)
    assert state.finish_reason == "stop"  # the grammar ended it, not max_tokens
    jsonschema.validate(json.loads(state.text), PERSON)


@pytest.mark.parametrize("seed", range(3))
def test_gbnf_grammar_and_regex_are_obeyed(tokenizer, seed):
    gbnf = 'root ::= "answer: " ("yes" | "no") " (" [0-9] [0-9]? "%)"'
    state = generate_random(tokenizer, {"kind": "grammar", "text": gbnf}, seed)
    assert re.fullmatch(r"answer: (yes|no) \([0-9][0-9]?%\)", state.text), state.text
    state = generate_random(tokenizer, {"kind": "regex", "text": r"[a-c]{2,4}-[0-9]{3}"}, seed)
    assert re.fullmatch(r"[a-c]{2,4}-[0-9]{3}", state.text), state.text


def test_mask_allows_exactly_the_next_tokens(tokenizer):
    """After '{"name": "' of PERSON, a raw newline is masked (not allowed in a JSON string) and
    letters are not; once the object is complete only end-of-generation tokens remain."""
    params = SamplingParams(temperature=0, constraint={"kind": "json_schema",
                                                       "text": json.dumps(PERSON)})  # fmt: skip
    sampler = build_sampler(params, tokens=[1], tokenizer=tokenizer)
    for token in tokenizer.encode_continuation('{"name": "'):
        sampler.accept(token)
    stage = dict(sampler.stages)["grammar"]
    out = stage(np.zeros(tokenizer.n_vocab, np.float32), sampler.ctx)
    letter = tokenizer.encode_continuation("a")[0]
    newline = tokenizer.token_id("<0x0A>")
    assert out[letter] == 0 and out[newline] == -np.inf
    for token in tokenizer.encode_continuation('Al", "age": 7, "pets": []}'):
        sampler.accept(token)
    out = stage(np.zeros(tokenizer.n_vocab, np.float32), sampler.ctx)
    assert set(np.flatnonzero(out == 0).tolist()) == set(tokenizer.eog_ids)


def test_a_chain_without_the_grammar_stage_still_gets_it(tokenizer):
    params = SamplingParams(chain="top_k;temperature", temperature=0.5,
                            constraint={"kind": "json_object"})  # fmt: skip
    sampler = build_sampler(params, tokens=[1], tokenizer=tokenizer)
    assert sampler.chain[0] == "grammar"
    plain = build_sampler(SamplingParams(chain="top_k, temperature"))
    assert plain.chain == ["top_k", "temperature", "dist"]


def test_a_constrained_sequence_is_sampled_on_the_host(tokenizer):
    """Greedy or not, a constraint keeps the pick off the device (its chain has a stage
    DeviceSampling cannot express)."""
    for temperature in (0.0, 0.7):
        params = SamplingParams(temperature=temperature, constraint={"kind": "json_object"})
        sampler = build_sampler(params, tokens=[1], tokenizer=tokenizer)
        state = SequenceState([1], tokenizer, sampler, max_tokens=8, n_ctx=64)
        assert not state.is_greedy and state.device_pick() is None


@pytest.mark.parametrize(
    "constraint, words",
    [
        ({"kind": "json_schema", "text": "{not json"}, "not JSON"),
        ({"kind": "json_schema", "text": "[1, 2]"}, "a schema is an object"),
        ({"kind": "json_schema", "text": '{"type": "bogus"}'}, "Invalid type: bogus"),
        ({"kind": "json_schema", "text": '{"format": "bogus"}'}, "Unknown format: bogus"),
        ({"kind": "grammar", "text": "root ::= ("}, "grammar"),
        ({"kind": "regex", "text": "a(b"}, "regex"),
    ],
)
def test_bad_constraints_are_config_errors_naming_the_problem(constraint, words):
    with pytest.raises(ConfigError, match=re.escape(words)) as info:
        compile_grammar(Constraint(**constraint))
    assert info.value.fields == ["constraint"]
    with pytest.raises(ConfigError):
        build_sampler(SamplingParams(constraint=constraint))


def test_unknown_constraint_kind_is_refused():
    with pytest.raises(ConfigError, match="constraint.kind"):
        SamplingParams(constraint={"kind": "xml"})


def test_the_stage_needs_the_tokenizer():
    sampler = build_sampler(SamplingParams(constraint={"kind": "json_object"}))
    with pytest.raises(UsageError, match="tokenizer"):
        sampler.sample(np.zeros(100, np.float32))


@pytest.fixture(scope="module")
def default_model(default_model_path):
    import forge

    return forge.load(default_model_path, backend="cpu_simd", n_ctx=512)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_default_model_output_parses_and_matches_the_schema(default_model, temperature):
    m = default_model
    prompt = m.chat_prompt([{"role": "user", "content": "Describe a person as JSON."}])
    done = m.complete(prompt, max_tokens=120, temperature=temperature, seed=7,
                      constraint={"kind": "json_schema", "text": json.dumps(PERSON)})  # fmt: skip
    assert done.finish_reason == "stop", done.text
    jsonschema.validate(json.loads(done.text), PERSON)
