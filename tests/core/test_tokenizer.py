"""Tokenizers against llama.cpp's golden tokenizations, round trips, streaming and bad metadata."""

from __future__ import annotations

import time
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from forge.errors import ModelError, UnsupportedModelError, UsageError
from forge.gguf import open_gguf
from forge.tokenizer import StreamDecoder, TokenType, tokenizer_from_metadata
from forge.tokenizer.pretokenize import PreTokenizer

GOLDEN_MODELS = [
    "gemma3-f16.gguf", "gemma3-q4_k_m.gguf", "llama-bf16.gguf", "llama-f16.gguf",
    "llama-f32.gguf", "llama-q4_0.gguf", "llama-q4_1.gguf", "llama-q5_0.gguf", "llama-q5_1.gguf",
    "llama-q8_0.gguf", "qwen2-q2_k.gguf", "qwen2-q3_k.gguf", "qwen2-q4_k.gguf", "qwen2-q5_k.gguf",
    "qwen2-q6_k.gguf", "qwen3-q4_k_m.gguf", "qwen3-q8_0.gguf",
]  # fmt: skip


@cache
def _tokenizer(path: str):
    return tokenizer_from_metadata(open_gguf(path).metadata)


def _golden_tok(golden_dir: Path, model: str):
    return _tokenizer(str(golden_dir / "models" / model))


@pytest.fixture(scope="module")
def default_tok(default_model_path):
    return _tokenizer(default_model_path)


@pytest.fixture(scope="module")
def default_golden(golden_dir):
    import json

    return json.loads((golden_dir / "gemma3-270m.json").read_text())["models"][0]


def _explain(tok, got: list[int], want: list[int]) -> str:
    """Where two id lists part, with token texts, so a mismatch is readable in the report."""
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    show = lambda ids: [(t, tok.token_text(t)) for t in ids[i : i + 6]]  # noqa: E731
    return (f"first difference at index {i} (len got {len(got)}, want {len(want)}):\n"
            f"  got  {show(got)}\n  want {show(want)}")  # fmt: skip


# -- golden tokenizations ----------------------------------------------------------------------
@pytest.mark.parametrize("case", [0, 1, 2])
@pytest.mark.parametrize("model", GOLDEN_MODELS)
def test_encode_matches_llama_cpp(golden_dir, synthetic_golden, model, case):
    entry = synthetic_golden[model]
    tok = _golden_tok(golden_dir, model)
    assert tok.n_vocab == entry["n_vocab"]
    prompt, want = entry["cases"][case]["prompt"], entry["cases"][case]["tokens"]
    got = tok.encode(prompt)
    assert got == want, f"{model} {prompt!r}: " + _explain(tok, got, want)


@pytest.mark.parametrize("model", GOLDEN_MODELS)
def test_decode_matches_llama_cpp_greedy_text(golden_dir, synthetic_golden, model):
    """llama.cpp's text of its greedy continuations (random weights: byte soup, U+FFFD)."""
    tok = _golden_tok(golden_dir, model)
    for case in synthetic_golden[model]["cases"]:
        assert tok.decode(case["greedy"]) == case["greedy_text"], (model, case["greedy"])


def test_default_model_golden(default_tok, default_golden):
    assert default_tok.n_vocab == default_golden["n_vocab"] == 262144
    for case in default_golden["cases"]:
        got = default_tok.encode(case["prompt"])
        assert got == case["tokens"], f"{case['prompt']!r}: " + _explain(
            default_tok, got, case["tokens"]
        )
        assert default_tok.decode(case["greedy"]) == case["greedy_text"]
        # the greedy text re-encodes to the same ids (no BOS: it continues a prompt)
        assert default_tok.encode(case["greedy_text"], add_special=False) == case["greedy"]


def test_default_model_special_ids(default_tok):
    assert (default_tok.bos_id, default_tok.eos_id, default_tok.add_bos) == (2, 1, True)
    assert default_tok.eog_ids == {1, default_tok.token_id("<end_of_turn>")} == {1, 106}
    assert default_tok.chat_template is None  # this GGUF ships none; see test_chat_template


def test_default_model_build_and_encode_speed(default_model_path, default_tok, capsys):
    """Budget: load-to-first-token is 3 s, so building must be well under 1 s."""
    metadata = open_gguf(default_model_path).metadata
    t0 = time.perf_counter()
    tokenizer_from_metadata(metadata)
    build = time.perf_counter() - t0
    prompt = "Once upon a time, in a small village, there lived a girl who loved to read."
    t0 = time.perf_counter()
    for _ in range(20):
        default_tok.encode(prompt)
    encode = (time.perf_counter() - t0) / 20
    with capsys.disabled():
        print(f"\n  tokenizer build {build * 1e3:.0f} ms, encode 17-token prompt "
              f"{encode * 1e3:.2f} ms")  # fmt: skip
    assert build < 1.0 and encode < 0.02  # loose guards, 5-10x above what is measured


# -- round trips -------------------------------------------------------------------------------
ROUND_TRIP = [
    "Hello world", "  leading and trailing spaces  ", "tabs\tand\nnew\n\nlines",
    "café naïve — done!", "emoji 🙂👍🏽 and CJK 漢字", "def f(x):\n    return x * 2\n", "",
]  # fmt: skip


@pytest.mark.parametrize("model", ["llama-f32.gguf", "gemma3-f16.gguf", "qwen2-q4_k.gguf"])
@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip_synthetic(golden_dir, model, text):
    tok = _golden_tok(golden_dir, model)
    ids = tok.encode(text)
    assert tok.decode(ids) == text, [(i, tok.token_text(i)) for i in ids]


@pytest.mark.parametrize("text", ROUND_TRIP + ["<table><tr>html</tr></table>", "\t\t\tindent"])
def test_round_trip_default_model(default_tok, text):
    ids = default_tok.encode(text)
    assert default_tok.decode(ids) == text


def test_empty_text(golden_dir, default_tok):
    llama = _golden_tok(golden_dir, "llama-f32.gguf")
    qwen = _golden_tok(golden_dir, "qwen2-q4_k.gguf")
    assert llama.encode("") == [1] and llama.encode("", add_special=False) == []
    assert qwen.encode("") == [] and default_tok.encode("") == [2]


def test_byte_fallback_spm(golden_dir):
    tok = _golden_tok(golden_dir, "llama-f32.gguf")
    # the tiny vocabulary has no 'é': its UTF-8 bytes C3 A9 become <0xC3> <0xA9>
    ids = tok.encode("é", add_special=False)
    assert [tok.token_text(i) for i in ids] == ["▁", "<0xC3>", "<0xA9>"]
    assert tok.token_bytes(ids[1]) == b"\xc3" and tok.decode(ids[1:2]) == "\ufffd"


# -- streaming ---------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["llama-f32.gguf", "qwen2-q4_k.gguf"])
def test_stream_holds_back_split_characters(golden_dir, model):
    tok = _golden_tok(golden_dir, model)
    ids = tok.encode("a🙂b", add_special=False)
    emoji_ids = [i for i in ids if len(tok.token_bytes(i)) == 1 and tok.token_bytes(i)[0] >= 0x80]
    assert len(emoji_ids) == 4, [(i, tok.token_bytes(i)) for i in ids]  # one token per byte
    stream = StreamDecoder(tok)
    outputs = [stream.push(i) for i in ids]
    assert "".join(outputs) + stream.flush() in ("a🙂b", " a🙂b")
    for out in outputs:
        assert "\ufffd" not in out
    # the three leading bytes of the emoji give nothing; the fourth gives the whole character
    pos = ids.index(emoji_ids[0])
    assert outputs[pos : pos + 3] == ["", "", ""] and outputs[pos + 3] == "🙂"


def test_stream_flush_reports_unfinished_character(golden_dir):
    tok = _golden_tok(golden_dir, "llama-f32.gguf")
    stream = StreamDecoder(tok)
    assert stream.push(tok.token_id("<0xF0>")) == ""
    assert stream.push(tok.token_id("<0x9F>")) == ""
    assert stream.flush() == "\ufffd"
    assert stream.push(tok.token_id("<0x41>")) == "A"  # usable again after flush


@pytest.mark.parametrize("model", GOLDEN_MODELS[::3])
def test_stream_equals_decode_on_greedy(golden_dir, synthetic_golden, model):
    tok = _golden_tok(golden_dir, model)
    for case in synthetic_golden[model]["cases"]:
        stream = StreamDecoder(tok)
        text = "".join(stream.push(i) for i in case["greedy"]) + stream.flush()
        assert text == case["greedy_text"]


def test_stream_skips_control_tokens(default_tok):
    stream = StreamDecoder(default_tok)
    assert stream.push(106) == "" and stream.push(default_tok.token_id("▁Hi")) == " Hi"
    assert StreamDecoder(default_tok, skip_special=False).push(106) == "<end_of_turn>"


def test_piece_remembers_each_id_per_skip_flag(golden_dir):
    """piece() keeps what it worked out per id, once with control tokens skipped and once
    not: asking in either order gives each flag its own answer, and ids out of range fail
    every time (none wraps around from the end)."""
    for first in (True, False):
        meta = _good_spm()
        meta["tokenizer.ggml.token_type"] = np.array([TokenType.CONTROL, 1, 1], np.int32)
        tok = tokenizer_from_metadata(meta)
        assert tok.piece(0, first) == (b"" if first else tok.token_bytes(0))
        assert tok.piece(0, not first) == (tok.token_bytes(0) if first else b"")
        assert tok.piece(0, first) == (b"" if first else tok.token_bytes(0))
        assert tok.piece(1) == tok.token_bytes(1) != b""
        for bad in (-1, 3, -3):
            with pytest.raises(UsageError, match="out of range"):
                tok.piece(bad)


# -- special tokens ----------------------------------------------------------------------------
def test_special_tokens_parsed_in_text(default_tok):
    tok = default_tok
    text = "<start_of_turn>user\nHi there<end_of_turn>\n"
    ids = tok.encode(text, add_special=False)
    plain = tok.encode("user", add_special=False)
    rest = tok.encode("Hi there", add_special=False)
    assert ids == [105] + plain + [107] + rest + [106, 107]
    # without parse_special the control tokens are plain text; user-defined "\n" still matches
    raw = tok.encode(text, add_special=False, parse_special=False)
    assert 105 not in raw and 106 not in raw and 107 in raw
    assert tok.decode(raw) == text and tok.decode(ids) == "user\nHi there\n"
    assert tok.decode(ids, skip_special=False) == text


def test_special_tokens_bpe_and_spm_prefix(golden_dir):
    qwen = _golden_tok(golden_dir, "qwen2-q4_k.gguf")
    im_start, im_end = qwen.token_id("<|im_start|>"), qwen.token_id("<|im_end|>")
    ids = qwen.encode("<|im_start|>user hi<|im_end|>")
    assert ids[0] == im_start and ids[-1] == im_end
    assert ids[1:-1] == qwen.encode("user hi", add_special=False)
    assert qwen.eog_ids == {qwen.eos_id, qwen.token_id("<|endoftext|>")} == {466, 468}
    # SPM with a space prefix: text after a special token gets the prefix again (llama.cpp)
    llama = _golden_tok(golden_dir, "llama-f32.gguf")
    assert llama.encode("</s>the") == [1, 2] + llama.encode("the", add_special=False)
    assert llama.encode("</s>the", parse_special=False)[1:3] != [2]


def test_longest_special_token_wins(default_tok):
    # "\n\n\n" is one user-defined token; it must not be split into "\n" + "\n\n"
    assert default_tok.encode("a\n\n\nb", add_special=False)[1] == 109


def _partition_reference(tokens, types, text: str, parse_special: bool) -> list:
    """The matching rule spelled out: every special text occurring in `text` (control and
    unknown ones only with parse_special), longest first, lowest id first among equals, each
    split out of the plain pieces in turn."""
    kinds = {TokenType.UNKNOWN, TokenType.CONTROL, TokenType.USER_DEFINED}
    if not parse_special:
        kinds = {TokenType.USER_DEFINED}
    found = sorted((-len(t), i, t) for i, (t, k) in enumerate(zip(tokens, types))
                   if t and int(k) in kinds and t in text)  # fmt: skip
    pieces: list = [text] if text else []
    for _, tid, t in found:
        out: list = []
        for p in pieces:
            if isinstance(p, int):
                out.append(p)
                continue
            for k, part in enumerate(p.split(t)):
                if k:
                    out.append(tid)
                if part:
                    out.append(part)
        pieces = out
    return pieces


def test_special_partition_matches_the_rule(default_tok):
    # Gemma: 6,414 special texts (6,321 start with "<"), overlapping runs of "\n", " ", "\t"
    tok = default_tok
    kinds = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN)
    specials = [t for t, k in zip(tok._tokens, tok._types) if int(k) in kinds]
    plain = ["hello", " world", "<", ">", "<start", "_of_turn>", "\n", "  ", "\t", "<b", "x"]
    rng = np.random.default_rng(7)
    for _ in range(400):
        choices = [(specials if rng.random() < 0.3 else plain) for _ in range(rng.integers(10))]
        parts = [c[rng.integers(len(c))] for c in choices]
        text = "".join(parts)
        for parse_special in (True, False):
            want = _partition_reference(tok._tokens, tok._types, text, parse_special)
            assert tok._matcher.partition(text, parse_special) == want, repr(text)


def test_special_partition_overlaps_and_duplicates():
    from forge.tokenizer.special import SpecialMatcher

    C, U, N = TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.NORMAL
    tokens = ["a", "ab", "abc", "bcd", "<x>", "<x>", "cd"]
    types = np.array([N, U, U, U, C, U, U], dtype=np.int32)
    matcher = SpecialMatcher(tokens, types)
    for text in ["abcd", "xabcdx", "bcdab", "<x><x>", "a<x>bcd", "", "zzz", "abab"]:
        for parse_special in (True, False):
            want = _partition_reference(tokens, types, text, parse_special)
            assert matcher.partition(text, parse_special) == want, (text, parse_special)
    assert matcher.partition("a<x>", True) == ["a", 4]  # the control token: lower id
    assert matcher.partition("a<x>", False) == ["a", 5]  # only the user-defined one


# -- the algorithms on hand-made vocabularies --------------------------------------------------
def _spm_meta(tokens, scores, **extra):
    n = len(tokens)
    meta = {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
        "tokenizer.ggml.token_type": np.array([TokenType.NORMAL] * n, dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0,
        "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_space_prefix": False,
    }  # fmt: skip
    meta.update(extra)
    return meta


@pytest.mark.parametrize(("s_ab", "s_bc", "want"), [
    (-1.0, 0.0, ["a", "bc"]),  # the higher-scored pair merges first, wherever it is
    (0.0, -1.0, ["ab", "c"]),
    (0.0, 0.0, ["ab", "c"]),   # ties: leftmost pair first
])  # fmt: skip
def test_spm_merges_by_score(s_ab, s_bc, want):
    tokens = ["<s>", "a", "b", "c", "ab", "bc"]
    tok = tokenizer_from_metadata(_spm_meta(tokens, [0, 0, 0, 0, s_ab, s_bc]))
    assert [tok.token_text(i) for i in tok.encode("abc")] == want


def test_bpe_merges_by_rank():
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    base = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.pre": "qwen2"}  # fmt: skip
    tok = tokenizer_from_metadata({**base, "tokenizer.ggml.merges": ["b c", "a b", "ab c"]})
    assert [tok.token_text(i) for i in tok.encode("abc")] == ["a", "bc"]  # "ab c" never applies
    tok = tokenizer_from_metadata({**base, "tokenizer.ggml.merges": ["a b", "b c", "ab c"]})
    assert [tok.token_text(i) for i in tok.encode("abc")] == ["abc"]


@pytest.mark.parametrize(("pre", "text", "words"), [
    ("llama-bpe", "Hello world 12345!!\n\nit's I'M", ["Hello", " world", " ", "123", "45",
                                                        "!!\n\n", "it", "'s", " I", "'M"]),
    ("qwen2", "x  123 a  b", ["x", " ", " ", "1", "2", "3", " a", " ", " b"]),
    ("gpt2", "it's I'M  x", ["it", "'s", " I", "'", "M", " ", " x"]),
    ("default", "Hello, world! a+b", ["Hello", ",", " world", "!", " a", "+", "b"]),
    # o200k: upper-case runs then lower-case ones (or the reverse) in one word, contractions
    # kept on the word, a punctuation mark may lead a word, digits in threes, newlines and "/"
    # after punctuation
    ("gpt-4o", "HELLOworld helloWORLD I'M don't", ["HELLOworld", " hello", "WORLD", " I'M",
                                                   " don't"]),
    ("gpt-4o", "x 12345 a/b/\n\n  y", ["x", " ", "123", "45", " a", "/b", "/\n\n", " ",
                                         " y"]),
    ("gpt-4o", "café, naïve Été", ["café", ",", " naïve", " Été"]),
])  # fmt: skip
def test_pretokenizer_splits(pre, text, words):
    assert PreTokenizer(pre).split(text) == words


# -- bad metadata ------------------------------------------------------------------------------
def _good_spm():
    return _spm_meta(["<s>", "a", "b"], [0, 0, 0])


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"tokenizer.ggml.model": None}, ModelError, "tokenizer.ggml.model is missing"),
    ({"tokenizer.ggml.model": "bert"}, UnsupportedModelError, "unsupported tokenizer model"),
    ({"tokenizer.ggml.tokens": None}, ModelError, "tokens is missing"),
    ({"tokenizer.ggml.tokens": []}, ModelError, "tokens is missing or empty"),
    ({"tokenizer.ggml.scores": np.zeros(2, np.float32)}, ModelError, "3 values"),
    ({"tokenizer.ggml.token_type": np.ones(4, np.int32)}, ModelError, "token_type"),
    ({"tokenizer.ggml.token_type": np.array([1, 9, 1])}, ModelError, "not a known token type"),
    ({"tokenizer.ggml.bos_token_id": 7}, ModelError, "out of range"),
    ({"tokenizer.ggml.add_bos_token": "yes"}, ModelError, "must be a boolean"),
    ({"tokenizer.ggml.model": "gpt2"}, ModelError, "needs tokenizer.ggml.merges"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "mystery", "tokenizer.ggml.merges": []},
     UnsupportedModelError, "pre-tokenizer 'mystery'"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": ["ab"]}, ModelError, "'left right'"),
])  # fmt: skip
def test_bad_metadata(change, error, message):
    meta = _good_spm()
    for key, value in change.items():
        if value is None:
            meta.pop(key)
        else:
            meta[key] = value
    with pytest.raises(error, match=message):
        tokenizer_from_metadata(meta)


def test_bad_ids_and_byte_tokens():
    tok = tokenizer_from_metadata(_good_spm())
    with pytest.raises(UsageError, match="out of range"):
        tok.decode([3])
    meta = _good_spm()
    meta["tokenizer.ggml.token_type"] = np.array([1, 6, 1], np.int32)  # "a" claims to be a byte
    with pytest.raises(ModelError, match="not of the form <0xNN>"):
        tokenizer_from_metadata(meta).decode([1])
    # no byte tokens: a character outside the vocabulary becomes the unknown token (default 0)
    assert tok.encode("zab") == [0, 1, 2]
    meta = {**_good_spm(), "tokenizer.ggml.unknown_token_id": 99}  # out of range: ignored
    with pytest.raises(ModelError, match="no <0x7A> token and no unknown token"):
        tokenizer_from_metadata(meta).encode("z")
