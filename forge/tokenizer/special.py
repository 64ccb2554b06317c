"""Splitting text on the literal text of special tokens, as llama.cpp's tokenizer does.

Control, unknown and user-defined tokens are matched in the text, longest token text first; each
match becomes that token and the text around it is left for the model's algorithm. Control and
unknown tokens are only matched when `parse_special` is set; user-defined ones (Gemma's "\\n\\n",
runs of spaces, "<table>") always are.
"""

from __future__ import annotations

import re

import numpy as np

# TokenType values (forge.tokenizer.base imports this module, so they are repeated here)
_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4


class SpecialMatcher:
    """Finds special tokens in text. Built once per vocabulary."""

    def __init__(self, tokens: list[str], types: np.ndarray):
        ids = np.flatnonzero(np.isin(types, (_UNKNOWN, _CONTROL, _USER_DEFINED)))
        entries = [(tokens[i], int(i), int(types[i]) != _USER_DEFINED) for i in ids.tolist()]
        self._by_text: dict[str, list[tuple[str, int, bool]]] = {}  # (a text may name two ids)
        for e in entries:
            if e[0]:
                self._by_text.setdefault(e[0], []).append(e)
        # every prefix of a token's text: a scan from a position stops at the first miss.
        # (Gemma has 6,414 special texts, 6,321 of them starting with "<": testing each one
        # with `in` cost ~0.4 ms per prompt; the scan visits only the few positions that can
        # start one.)
        self._prefixes = {t[:n] for t in self._by_text for n in range(1, len(t) + 1)}
        starts = "".join(re.escape(c) for c in sorted({t[0] for t in self._by_text}))
        self._starts = re.compile(f"[{starts}]") if starts else None

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split `text` into plain-text pieces (str) and special token ids (int), in order.

        Empty pieces are dropped, so empty text gives an empty list.
        """
        if not text:
            return []
        if self._starts is None or self._starts.search(text) is None:
            return [text]
        frags: list[str | int] = [text]
        found = [e for e in self._occurring(text) if parse_special or not e[2]]
        for tok_text, tok_id, _ in found:
            frags = _split_all(frags, tok_text, tok_id)
        return frags

    def _occurring(self, text: str) -> list[tuple[str, int, bool]]:
        """The entries whose text occurs in `text`, longest first (ties: lowest id first)."""
        prefixes, by_text = self._prefixes, self._by_text
        hits: set[str] = set()
        for m in self._starts.finditer(text):
            i = m.start()
            for j in range(i + 1, len(text) + 1):
                piece = text[i:j]
                if piece not in prefixes:
                    break
                if piece in by_text:
                    hits.add(piece)
        return sorted((e for t in hits for e in by_text[t]), key=_longest_first)


def _longest_first(entry: tuple[str, int, bool]) -> tuple[int, int]:
    # the id breaks ties so the order never depends on the vocabulary's order
    return -len(entry[0]), entry[1]


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
