"""A prompt text that cannot fit the context is refused before it is tokenized: no token stands
for more than `Tokenizer.max_token_bytes` bytes, so n bytes make at least n / that many tokens."""

from __future__ import annotations

import random
import warnings

import pytest

from forge.errors import ContextOverflowError
from forge.gguf import open_gguf
from forge.tokenizer import tokenizer_from_metadata

MODELS = ["llama-f32", "qwen2-q4_k", "gemma3-q4_k_m"]


@pytest.mark.parametrize("name", MODELS)
def test_the_bound_holds_for_real_vocabularies(golden_dir, name):
    tok = tokenizer_from_metadata(open_gguf(golden_dir / "models" / f"{name}.gguf").metadata)
    bound = tok.max_token_bytes
    rng = random.Random(7)
    alphabet = list("abc xyz  \n\t.,") + ["é", "日本", "🙂", "<|im_start|>", "<s>", "    "]
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
        n_bytes = len(text.encode())
        assert len(tok.encode(text, add_special=False)) >= -(-n_bytes // bound), text
    # and the longest piece itself is one token of exactly that many bytes (or 4, a character)
    assert bound == max(4, max(len(tok.token_text(i).encode()) for i in range(tok.n_vocab)))


def test_a_prompt_beyond_any_tokenization_is_refused_untokenized(golden_dir, monkeypatch):
    from forge.api import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load(str(golden_dir / "models" / "llama-f32.gguf"), backend="cpu_simd", n_ctx=64)
    limit = 64 * model.tokenizer.max_token_bytes

    def refuse(*args, **kwargs):
        raise AssertionError("tokenized")

    monkeypatch.setattr(model.tokenizer, "encode", refuse)
    with pytest.raises(ContextOverflowError, match="at least 65 tokens"):
        model.start("a" * (limit + 1), max_tokens=1)
    with pytest.raises(AssertionError, match="tokenized"):  # one byte less: it must tokenize
        model.start("a" * limit, max_tokens=1)
