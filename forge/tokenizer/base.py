"""The Tokenizer interface shared by the SentencePiece and byte-level BPE tokenizers.

A tokenizer holds the vocabulary read from GGUF metadata (token texts, token types, special ids)
and implements encoding the way llama.cpp does: the text is first split on special tokens
(`forge.tokenizer.special.partition`), then every plain-text fragment is encoded by the model's
algorithm (`_encode_fragment`, supplied by the subclass).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from forge.errors import UsageError
from forge.tokenizer.special import SpecialMatcher


class TokenType(IntEnum):
    """GGUF `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


@dataclass(frozen=True)
class SpecialIds:
    """Special token ids of a vocabulary; None where the model has no such token."""

    bos: int | None
    eos: int | None
    unk: int | None
    pad: int | None
    eog: frozenset[int]  # end-of-generation: eos, eot, eom and end-of-turn tokens


@dataclass(frozen=True)
class Vocab:
    """What every tokenizer needs from the GGUF metadata."""

    tokens: list[str]  # token texts, as stored in the file
    types: np.ndarray  # int32 [n_vocab], TokenType values
    token_to_id: dict[str, int]  # text -> id; the last id wins on duplicate texts
    special: SpecialIds
    add_bos: bool
    add_eos: bool
    chat_template: str | None


class Tokenizer(ABC):
    """Text <-> token ids for one model.

    `encode` reproduces llama.cpp's token ids exactly; `decode` and `token_bytes` give the text
    back. Subclasses implement `_encode_fragment` (plain text -> ids, appended to `out`) and
    `_piece` (one token -> bytes).
    """

    def __init__(self, vocab: Vocab):
        self._vocab = vocab
        self._tokens = vocab.tokens
        self._types = vocab.types
        self._token_to_id = vocab.token_to_id
        self._matcher = SpecialMatcher(vocab.tokens, vocab.types)
        self._max_token_bytes: int | None = None
        # piece()'s bytes per token id, filled as ids are first asked for: a server streams
        # tens of thousands of tokens a second through it ([skip_special False, True])
        self._pieces: tuple[list[bytes | None], list[bytes | None]] = (
            [None] * len(vocab.tokens),
            [None] * len(vocab.tokens),
        )

    # -- properties ----------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    @property
    def max_token_bytes(self) -> int:
        """An upper bound on the bytes of text one token stands for (>= 4: one character),
        so a text of n bytes has at least n / max_token_bytes tokens."""
        if self._max_token_bytes is None:
            longest = max((len(t.encode("utf-8", errors="surrogatepass")) for t in self._tokens),
                          default=0)  # fmt: skip
            self._max_token_bytes = max(4, longest)
        return self._max_token_bytes

    @property
    def bos_id(self) -> int | None:
        return self._vocab.special.bos

    @property
    def eos_id(self) -> int | None:
        return self._vocab.special.eos

    @property
    def unk_id(self) -> int | None:
        return self._vocab.special.unk

    @property
    def pad_id(self) -> int | None:
        return self._vocab.special.pad

    @property
    def eog_ids(self) -> frozenset[int]:
        """Ids that end generation: eos plus end-of-turn tokens such as <end_of_turn>."""
        return self._vocab.special.eog

    @property
    def add_bos(self) -> bool:
        return self._vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self._vocab.add_eos

    @property
    def chat_template(self) -> str | None:
        """The model's Jinja chat template (`tokenizer.chat_template`), or None if it has none."""
        return self._vocab.chat_template

    def token_text(self, token_id: int) -> str:
        """The token's text as stored in the vocabulary (e.g. '▁the', 'Ġthe', '<0x0A>')."""
        return self._tokens[self._check_id(token_id)]

    def token_type(self, token_id: int) -> TokenType:
        return TokenType(int(self._types[self._check_id(token_id)]))

    def token_id(self, text: str) -> int | None:
        """The id of the token whose vocabulary text is exactly `text`, or None."""
        return self._token_to_id.get(text)

    def is_special(self, token_id: int) -> bool:
        """True for control and unknown tokens (those `decode(skip_special=True)` drops)."""
        return int(self._types[self._check_id(token_id)]) in _SPECIAL_TYPES

    # -- encoding ------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`, equal to llama.cpp's `llama_tokenize`.

        add_special: add BOS/EOS where the model's metadata asks for them.
        parse_special: text equal to a control token's text (e.g. "<start_of_turn>") becomes
            that token; when False only user-defined tokens are matched that way.
        """
        out: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        self._encode_fragments(self._matcher.partition(text, parse_special), out)
        if add_special and self.add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def encode_continuation(self, text: str) -> list[int]:
        """Ids whose bytes are exactly `text`, as it would be encoded in the middle of a
        sequence: no BOS or EOS, no SentencePiece space prefix, and control tokens' texts not
        parsed (user-defined tokens still are). For grammar engines that splice tokens."""
        out: list[int] = []
        Tokenizer._encode_fragments(self, self._matcher.partition(text, False), out)
        return out

    def _encode_fragments(self, fragments: list[str | int], out: list[int]) -> None:
        """Encode a partitioned text: ints are special token ids, strings are plain text."""
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
            else:
                self._encode_fragment(frag, out)

    @abstractmethod
    def _encode_fragment(self, text: str, out: list[int]) -> None:
        """Append the ids of one plain-text fragment (no special tokens in it) to `out`."""

    # -- decoding ------------------------------------------------------------------------------
    @abstractmethod
    def _piece(self, token_id: int) -> bytes:
        """The bytes one token stands for; control tokens give their text."""

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` decodes to (control tokens: their literal text).

        A byte-fallback token gives one byte, which may be part of a multi-byte UTF-8 sequence.
        """
        return self._piece(self._check_id(token_id))

    def piece(self, token_id: int, skip_special: bool = True) -> bytes:
        """The bytes `token_id` contributes inside a decoded sequence: b"" for control, unknown
        and unused tokens when `skip_special`, else as `token_bytes`."""
        known = self._pieces[bool(skip_special)]
        token_id = int(token_id)
        data = known[token_id] if 0 <= token_id < len(known) else None
        if data is None:
            token_id = self._check_id(token_id)
            skipped = skip_special and int(self._types[token_id]) in _SKIPPED_TYPES
            data = known[token_id] = b"" if skipped else self._piece(token_id)
        return data

    def decode_bytes(self, ids: list[int], skip_special: bool = True) -> bytes:
        """The concatenated bytes of `ids` (see `piece`)."""
        return b"".join([self.piece(i, skip_special) for i in ids])

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        """Text of `ids`. Invalid UTF-8 (e.g. a lone byte-fallback token) becomes U+FFFD."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def _check_id(self, token_id: int) -> int:
        token_id = int(token_id)
        if not 0 <= token_id < len(self._tokens):
            raise UsageError(f"token id {token_id} is out of range for a vocabulary of "
                             f"{len(self._tokens)} tokens")  # fmt: skip
        return token_id


_SPECIAL_TYPES = frozenset({TokenType.CONTROL, TokenType.UNKNOWN})
_SKIPPED_TYPES = frozenset({TokenType.CONTROL, TokenType.UNKNOWN, TokenType.UNUSED,
                            TokenType.UNDEFINED})  # fmt: skip
