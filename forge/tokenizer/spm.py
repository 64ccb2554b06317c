"""SentencePiece ("llama") tokenizer: llama.cpp's bigram-merge-by-score algorithm.

Spaces are shown as U+2581 ("▁") in the vocabulary. Encoding starts from single characters and
repeatedly merges the adjacent pair whose concatenation is the vocabulary token with the highest
score (ties: the leftmost pair). A character that is not a token becomes byte-fallback tokens <0xNN>
(its UTF-8 bytes).
"""

from __future__ import annotations

import heapq

from forge.errors import ModelError
from forge.tokenizer.base import Tokenizer, TokenType, Vocab

SPACE_MARK = "\u2581"


class SPMTokenizer(Tokenizer):
    """SentencePiece tokenizer with byte fallback, scores and an optional space prefix."""

    def __init__(self, vocab: Vocab, scores: list[float], add_space_prefix: bool):
        super().__init__(vocab)
        self._scores = scores
        self.add_space_prefix = add_space_prefix
        self._byte_ids = self._find_byte_tokens()

    def _find_byte_tokens(self) -> list[int | None]:
        """Id of the token for each byte value: <0xNN>, else the one-character token, else None."""
        byte_ids: list[int | None] = []
        for b in range(256):
            tid = self._token_to_id.get(f"<0x{b:02X}>")
            if tid is None and b < 0x80:
                tid = self._token_to_id.get(chr(b))
            byte_ids.append(tid)
        return byte_ids

    # -- encoding ------------------------------------------------------------------------------
    def _encode_fragments(self, fragments: list[str | int], out: list[int]) -> None:
        prev_special = True  # the first text fragment gets the space prefix too
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
            else:
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                self._encode_fragment(frag, out)
                prev_special = False

    def _encode_fragment(self, text: str, out: list[int]) -> None:
        text = text.replace(" ", SPACE_MARK)
        n = len(text)
        if n == 0:
            return
        # symbols are spans of `text`: start, length (0 once merged away), prev, next
        starts = list(range(n))
        lens = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n)) + [-1]
        heap: list[tuple[float, int, int, int]] = []  # (-score, left, right, total length)
        vocab = self._token_to_id
        scores = self._scores

        def try_add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            size = lens[left] + lens[right]
            piece = text[starts[left] : starts[left] + size]
            tid = vocab.get(piece)
            if tid is None:
                return
            heapq.heappush(heap, (-scores[tid], left, right, size))

        for i in range(1, n):
            try_add(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if lens[left] == 0 or lens[right] == 0 or lens[left] + lens[right] != size:
                continue  # stale: one side was merged since this pair was queued
            lens[left] = size
            lens[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            try_add(prev[left], left)
            try_add(left, nxt[left])

        # Every merged symbol is a vocabulary token (only pairs that form tokens are queued), so
        # only unmerged single characters can miss the vocabulary: those fall back to bytes.
        i = 0
        while i != -1:
            piece = text[starts[i] : starts[i] + lens[i]]
            tid = vocab.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._byte_token(b) for b in piece.encode("utf-8", "surrogatepass"))
            i = nxt[i]

    def _byte_token(self, b: int) -> int:
        tid = self._byte_ids[b]
        if tid is None:
            if self.unk_id is None:
                raise ModelError(f"cannot encode byte 0x{b:02X}: the vocabulary has no <0x{b:02X}> "
                                 "token and no unknown token")  # fmt: skip
            return self.unk_id
        return tid

    # -- decoding ------------------------------------------------------------------------------
    def _piece(self, token_id: int) -> bytes:
        ttype = int(self._types[token_id])
        text = self._tokens[token_id]
        if ttype == TokenType.BYTE:
            return bytes([_parse_byte_token(text)])
        if ttype == TokenType.NORMAL:
            return text.replace(SPACE_MARK, " ").encode("utf-8", errors="surrogatepass")
        return text.encode("utf-8", errors="surrogatepass")

    def decode_bytes(self, ids: list[int], skip_special: bool = True) -> bytes:
        """Like Tokenizer.decode_bytes; a sequence that starts with BOS (an encoded prompt)
        loses the space that encode prefixed, so decode(encode(text)) == text."""
        data = super().decode_bytes(ids, skip_special)
        if self.add_space_prefix and ids and ids[0] == self.bos_id and data.startswith(b" "):
            data = data[1:]
        return data


def _parse_byte_token(text: str) -> int:
    """<0xNN> -> NN; a byte token with any other text is a malformed vocabulary."""
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return int(text[3:5], 16)
        except ValueError:
            pass
    raise ModelError(f"byte token {text!r} is not of the form <0xNN>")
