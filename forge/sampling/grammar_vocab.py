"""A forge `Tokenizer`'s vocabulary as llguidance sees it, built once per tokenizer.

llguidance computes token masks from each token's bytes; control, unknown and unused tokens are
marked special (their bytes prefixed with 0xFF, llguidance's convention), so that no grammar can
spell text with them. Building it walks the whole vocabulary (about 1.3 s for Gemma's 262,144
tokens), so the result is cached for as long as the tokenizer lives.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from forge.tokenizer import Tokenizer, TokenType

_SPECIAL = frozenset({TokenType.CONTROL, TokenType.UNKNOWN, TokenType.UNUSED, TokenType.UNDEFINED})
_MARK = b"\xff"  # llguidance: a token whose bytes start with 0xFF is special

_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class _Vocabulary:
    """The duck-typed tokenizer `llguidance.TokenizerWrapper` reads."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.tokens: list[bytes] = []
        self.special_token_ids: list[int] = []
        for token in range(tokenizer.n_vocab):
            data = tokenizer.token_bytes(token)
            if tokenizer.token_type(token) in _SPECIAL:
                data = _MARK + data
                self.special_token_ids.append(token)
            self.tokens.append(data)

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode_continuation(text)


def llg_tokenizer(tokenizer: Tokenizer) -> Any:
    """The `llguidance.LLTokenizer` of `tokenizer` (built on first use, then cached). Every
    end-of-generation token counts as its end of sequence."""
    with _lock:
        found = _cache.get(tokenizer)
        if found is None:
            import llguidance

            eog = sorted(tokenizer.eog_ids) or [tokenizer.eos_id or 0]
            wrapper = llguidance.TokenizerWrapper(_Vocabulary(tokenizer))
            found = llguidance.LLTokenizer(wrapper, n_vocab=tokenizer.n_vocab, eos_token=eog)
            _cache[tokenizer] = found
        return found
