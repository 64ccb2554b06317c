"""Incremental detokenization for streaming generated text."""

from __future__ import annotations

import codecs

from forge.tokenizer.base import Tokenizer


class StreamDecoder:
    """Turns generated token ids into text as they arrive.

    `push(id)` returns the text completed by that token. A UTF-8 sequence split over several
    tokens (byte-fallback tokens, or byte-level BPE pieces of one emoji) is held back until its
    last byte arrives, so no returned string ever contains half a character. Bytes that can never
    form valid UTF-8 come out as U+FFFD. Control tokens are dropped unless `skip_special=False`.
    Unlike `Tokenizer.decode`, no leading space is removed: generated text continues a prompt.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self._tok = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Feed one token; return the newly completed text (possibly "")."""
        data = self._tok.piece(token_id, self._skip_special)
        return self._utf8.decode(data) if data else ""

    def flush(self) -> str:
        """End of stream: return what is held back (an unfinished sequence becomes U+FFFD)."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
