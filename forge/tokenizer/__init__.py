"""Tokenizers read from GGUF metadata, streaming detokenization and chat templates.

`tokenizer_from_metadata(open_gguf(path).metadata)` gives a Tokenizer whose `encode(text)` returns
llama.cpp's ids (BOS included where the model asks for it) and whose `decode(ids)` gives the text
back; `StreamDecoder(tok).push(id)` returns generated text as it completes; `render_chat` renders a
conversation with `resolve_chat_template(tok)`.
"""

from forge.tokenizer.base import SpecialIds, Tokenizer, TokenType, Vocab
from forge.tokenizer.bpe import BPETokenizer
from forge.tokenizer.chat import render_chat, resolve_chat_template
from forge.tokenizer.loader import tokenizer_from_metadata
from forge.tokenizer.spm import SPMTokenizer
from forge.tokenizer.stream import StreamDecoder

__all__ = [
    "BPETokenizer", "SPMTokenizer", "SpecialIds", "StreamDecoder", "Tokenizer", "TokenType",
    "Vocab", "render_chat", "resolve_chat_template", "tokenizer_from_metadata",
]  # fmt: skip
