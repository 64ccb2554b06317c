"""Building a Tokenizer from GGUF metadata (`tokenizer.*` keys), with llama.cpp's defaults."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from forge.errors import ModelError, UnsupportedModelError
from forge.tokenizer.base import SpecialIds, Tokenizer, TokenType, Vocab
from forge.tokenizer.bpe import BPETokenizer, parse_merges
from forge.tokenizer.pretokenize import PreTokenizer
from forge.tokenizer.spm import SPMTokenizer

log = logging.getLogger(__name__)
_KEY = "tokenizer.ggml."
_REQUIRED_IN_RANGE = ("bos_token_id", "eos_token_id")
# texts of tokens that end a turn; llama.cpp adds them to the end-of-generation set by name
EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>",
)  # fmt: skip
# harmony (gpt-oss): structural tokens rendered in decoded text, as llama.cpp renders them, so
# a reply's channels can be told apart; and <|end|>, which ends a message but not the reply
HARMONY_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")
HARMONY_REPLY_ENDS = ("<|return|>", "<|call|>")
# pre-tokenizers whose words are looked up whole before merging (llama.cpp: ignore_merges)
_IGNORE_MERGES_PRE = {"llama3"}


def tokenizer_from_metadata(metadata: dict[str, Any]) -> Tokenizer:
    """The tokenizer described by a GGUF file's metadata (`GGUFFile.metadata`).

    Raises UnsupportedModelError for a tokenizer model or pre-tokenizer forge does not know, and
    ModelError for missing or inconsistent tokenizer metadata.
    """
    model = metadata.get(_KEY + "model")
    if model is None:
        raise ModelError("the model has no tokenizer: metadata key tokenizer.ggml.model is missing")
    if not isinstance(model, str) or model not in ("llama", "gpt2"):
        raise UnsupportedModelError(
            f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); "
            "forge supports 'llama' (SentencePiece) and 'gpt2' (byte-level BPE)"
        )
    tokens = _tokens(metadata)
    types = _types(metadata, len(tokens))
    token_to_id = {t: i for i, t in enumerate(tokens)}
    if model == "llama":
        pre = None
        defaults = {"bos": 1, "eos": 2, "unk": 0, "pad": None}
        add_bos_default = True
    else:
        pre = PreTokenizer(_str(metadata, "pre", "default"))
        defaults = {"bos": None, "eos": None, "unk": None, "pad": None}
        add_bos_default = pre.name == "llama3"
    special = _special_ids(metadata, tokens, types, token_to_id, defaults)
    template = metadata.get("tokenizer.chat_template")
    vocab = Vocab(
        tokens=tokens, types=types, token_to_id=token_to_id, special=special,
        add_bos=_bool(metadata, "add_bos_token", add_bos_default),
        add_eos=_bool(metadata, "add_eos_token", False),
        chat_template=template if isinstance(template, str) and template else None,
    )  # fmt: skip
    if model == "llama":
        scores = _array(metadata, "scores", len(tokens), np.float32)
        score_list = scores.tolist() if scores is not None else [0.0] * len(tokens)
        return SPMTokenizer(vocab, score_list, _bool(metadata, "add_space_prefix", True))
    merges = metadata.get(_KEY + "merges")
    if not isinstance(merges, list) or set(map(type, merges)) - {str}:
        raise ModelError("a 'gpt2' (BPE) tokenizer needs tokenizer.ggml.merges, a string array")
    return BPETokenizer(vocab, parse_merges(merges), pre, pre.name in _IGNORE_MERGES_PRE)


def _tokens(metadata: dict[str, Any]) -> list[str]:
    tokens = metadata.get(_KEY + "tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ModelError("tokenizer.ggml.tokens is missing or empty: the vocabulary is required")
    if set(map(type, tokens)) != {str}:  # C-speed check: 262k tokens in a few ms
        raise ModelError("tokenizer.ggml.tokens must be an array of strings")
    return tokens


def _array(metadata: dict[str, Any], name: str, n: int, dtype) -> np.ndarray | None:
    value = metadata.get(_KEY + name)
    if value is None:
        return None
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.shape[0] != n or not np.issubdtype(arr.dtype, np.number):
        raise ModelError(f"tokenizer.ggml.{name} must be a numeric array of {n} values (one per "
                         f"token), got {arr.shape[0] if arr.ndim == 1 else arr.shape}")  # fmt: skip
    return arr.astype(dtype, copy=False)


def _types(metadata: dict[str, Any], n: int) -> np.ndarray:
    types = _array(metadata, "token_type", n, np.int32)
    if types is None:
        return np.full(n, TokenType.NORMAL, dtype=np.int32)
    bad = np.flatnonzero((types < 0) | (types > max(TokenType)))
    if bad.size:
        raise ModelError(f"tokenizer.ggml.token_type[{bad[0]}] = {types[bad[0]]} is not a known "
                         "token type (0..6)")  # fmt: skip
    return types.copy()  # the EOG fix-up below writes to it


def _str(metadata: dict[str, Any], name: str, default: str) -> str:
    value = metadata.get(_KEY + name, default)
    if not isinstance(value, str):
        raise ModelError(f"tokenizer.ggml.{name} must be a string, got {value!r}")
    return value


def _bool(metadata: dict[str, Any], name: str, default: bool) -> bool:
    value = metadata.get(_KEY + name, default)
    if not isinstance(value, (bool, np.bool_)):
        raise ModelError(f"tokenizer.ggml.{name} must be a boolean, got {value!r}")
    return bool(value)


def _special_ids(metadata, tokens, types, token_to_id, defaults) -> SpecialIds:
    n = len(tokens)

    def get(key: str, default: int | None) -> int | None:
        value = metadata.get(_KEY + key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ModelError(f"tokenizer.ggml.{key} must be an integer, got {value!r}")
        if not 0 <= int(value) < n:
            if _KEY + key not in metadata:
                return None  # a default that this small vocabulary does not have
            if key not in _REQUIRED_IN_RANGE:
                # real files carry bogus pad/unk ids at times; llama.cpp ignores them too
                log.warning("ignoring tokenizer.ggml.%s = %s: out of range for %d tokens",
                            key, value, n)  # fmt: skip
                return None
            raise ModelError(f"tokenizer.ggml.{key} = {value} is out of range for a vocabulary "
                             f"of {n} tokens")  # fmt: skip
        return int(value)

    keys = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
            "pad": "padding_token_id"}  # fmt: skip
    ids = {name: get(key, defaults[name]) for name, key in keys.items()}
    eog = {i for i in (ids["eos"], get("eot_token_id", None), get("eom_token_id", None))
           if i is not None}  # fmt: skip
    harmony = all(t in token_to_id for t in HARMONY_REPLY_ENDS)
    for text in EOG_TEXTS:
        tid = token_to_id.get(text)
        if tid is not None:
            # llama.cpp treats these as control tokens whatever the file says
            types[tid] = TokenType.CONTROL
            if not (harmony and text == "<|end|>"):
                eog.add(tid)
    if harmony:
        for text in HARMONY_RENDERED:
            if text in token_to_id:
                types[token_to_id[text]] = TokenType.USER_DEFINED
    return SpecialIds(bos=ids["bos"], eos=ids["eos"], unk=ids["unk"], pad=ids["pad"],
                      eog=frozenset(eog))  # fmt: skip
