"""Splitting text on the literal text of special tokens, as llama.cpp's tokenizer does.

Control, unknown and user-defined tokens are matched in the text, longest token text first; each
match becomes that token and the text around it is left for the model's algorithm. Control and
unknown tokens are only matched when `parse_special` is set; user-defined ones (Gemma's "\\n\\n",
runs of spaces, "<table>") always are.
"""

from __future__ import annotations

import numpy as np

# TokenType values (forge.tokenizer.base imports this module, so they are repeated here)
_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4


class SpecialMatcher:
    """Finds special tokens in text. Built once per vocabulary."""

    def __init__(self, tokens: list[str], types: np.ndarray):
        ids = np.flatnonzero(np.isin(types, (_UNKNOWN, _CONTROL, _USER_DEFINED)))
        entries = [(tokens[i], int(i), int(types[i]) != _USER_DEFINED) for i in ids.tolist()]
        # longest first; the id breaks ties so the order never depends on the vocabulary's order
        entries = [e for e in entries if e[0]]
        entries.sort(key=lambda e: (-len(e[0]), e[1]))
        self._entries = entries
        # a token can only occur in text containing its first character: a cheap pre-filter
        self._first_chars = frozenset(e[0][0] for e in entries)

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split `text` into plain-text pieces (str) and special token ids (int), in order.

        Empty pieces are dropped, so empty text gives an empty list.
        """
        if not text:
            return []
        if self._first_chars.isdisjoint(text):
            return [text]
        frags: list[str | int] = [text]
        found = [e for e in self._entries if e[0] in text and (parse_special or not e[2])]
        for tok_text, tok_id, _ in found:
            frags = _split_all(frags, tok_text, tok_id)
        return frags


def _split_all(frags: list[str | int], tok_text: str, tok_id: int) -> list[str | int]:
    out: list[str | int] = []
    n = len(tok_text)
    for frag in frags:
        if isinstance(frag, int):
            out.append(frag)
            continue
        start = 0
        while (pos := frag.find(tok_text, start)) >= 0:
            if pos > start:
                out.append(frag[start:pos])
            out.append(tok_id)
            start = pos + n
        if start < len(frag):
            out.append(frag[start:])
    return out
