"""Byte-level BPE ("gpt2") tokenizer: GPT-2 byte mapping, pre-tokenizer, merges by rank.

Each word from the pre-tokenizer is turned into UTF-8 bytes, each byte shown as one printable
character (GPT-2's byte-to-unicode table), and adjacent symbols are merged lowest merge rank first
(ties: the leftmost pair), as llama.cpp does.
"""

from __future__ import annotations

import heapq

from forge.errors import ModelError
from forge.tokenizer.base import Tokenizer, TokenType, Vocab
from forge.tokenizer.pretokenize import PreTokenizer


def _byte_to_unicode() -> list[str]:
    """GPT-2's table: printable Latin-1 bytes map to themselves, the rest to U+0100 onwards."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = [], 0
    for b in range(256):
        if b in keep:
            table.append(chr(b))
        else:
            table.append(chr(0x100 + extra))
            extra += 1
    return table


BYTE_TO_UNICODE = _byte_to_unicode()
UNICODE_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}
_WORD_CACHE_MAX = 1 << 16


def parse_merges(merges: list[str]) -> dict[tuple[str, str], int]:
    """`tokenizer.ggml.merges` ("left right" strings) -> {(left, right): rank}."""
    ranks: dict[tuple[str, str], int] = {}
    for rank, merge in enumerate(merges):
        pos = merge.find(" ", 1)  # from 1: a merge's left part may itself be a space
        if pos < 0:
            raise ModelError(f"tokenizer.ggml.merges[{rank}] = {merge!r} is not 'left right'")
        ranks.setdefault((merge[:pos], merge[pos + 1 :]), rank)
    return ranks


class BPETokenizer(Tokenizer):
    """GPT-2 style byte-level BPE (Llama 3, Qwen2/3, GPT-2 vocabularies)."""

    def __init__(self, vocab: Vocab, merges: dict[tuple[str, str], int], pre: PreTokenizer,
                 ignore_merges: bool = False):  # fmt: skip
        super().__init__(vocab)
        self._ranks = merges
        self.pre = pre
        # Llama 3: a whole word that is a token is taken as is, without running the merges
        self._ignore_merges = ignore_merges
        self._cache: dict[str, list[int]] = {}

    def _encode_fragment(self, text: str, out: list[int]) -> None:
        for word in self.pre.split(text):
            ids = self._cache.get(word)
            if ids is None:
                ids = self._encode_word(word)
                if len(self._cache) >= _WORD_CACHE_MAX:
                    self._cache.clear()
                self._cache[word] = ids
            out.extend(ids)

    def _encode_word(self, word: str) -> list[int]:
        mapped = "".join(BYTE_TO_UNICODE[b] for b in word.encode("utf-8", "surrogatepass"))
        vocab = self._token_to_id
        if self._ignore_merges and mapped in vocab:
            return [vocab[mapped]]
        syms = list(mapped)  # symbol texts; "" once merged into its left neighbour
        n = len(syms)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n)) + [-1]
        heap: list[tuple[int, int, int, str]] = []  # (rank, left, right, merged text)
        ranks = self._ranks

        def try_add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            rank = ranks.get((syms[left], syms[right]))
            if rank is not None:
                heapq.heappush(heap, (rank, left, right, syms[left] + syms[right]))

        for i in range(1, n):
            try_add(i - 1, i)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            if not syms[left] or not syms[right] or syms[left] + syms[right] != merged:
                continue  # stale: a side changed since this pair was queued
            syms[left] = merged
            syms[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            try_add(prev[left], left)
            try_add(left, nxt[left])

        ids: list[int] = []
        for sym in syms:
            if not sym:
                continue
            tid = vocab.get(sym)
            if tid is not None:
                ids.append(tid)
                continue
            # llama.cpp's fallback: look each UTF-8 byte up as a one-character token; only
            # ASCII bytes can match, anything else is dropped
            for b in sym.encode("utf-8"):
                if b < 0x80 and (tid := vocab.get(chr(b))) is not None:
                    ids.append(tid)
        return ids

    def _piece(self, token_id: int) -> bytes:
        text = self._tokens[token_id]
        if int(self._types[token_id]) != TokenType.NORMAL:
            return text.encode("utf-8", errors="surrogatepass")
        out = bytearray()
        for ch in text:
            b = UNICODE_TO_BYTE.get(ch)
            if b is None:  # not a byte-level character: keep it as text
                out += ch.encode("utf-8", errors="surrogatepass")
            else:
                out.append(b)
        return bytes(out)
