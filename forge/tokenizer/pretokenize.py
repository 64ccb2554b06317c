"""Pre-tokenizer regexes for byte-level BPE, keyed by GGUF `tokenizer.ggml.pre`.

Text is cut into words before BPE merges run, as llama.cpp does: each regex of a pre-tokenizer is
applied in turn to every piece left by the previous one, and both the matches and the text between
them become pieces. The patterns need Unicode property classes (\\p{L}, \\p{N}, \\p{P}), which the
standard `re` module lacks, hence the `regex` package.
"""

from __future__ import annotations

import regex

from forge.errors import UnsupportedModelError

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"


def _llama3_style(digits: str) -> str:
    return (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + digits
            + r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip


# o200k (GPT-4o, gpt-oss): words are an optional leading non-letter, upper-case letters then
# lower-case ones (or the reverse), and a contraction. Letter case as llama.cpp's regex engine
# evaluates the original classes ([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}]):
# a letter other than a-z counts as upper case, one other than A-Z as lower case, so the ids
# equal llama.cpp's.
_UPPER = r"(?:(?=\p{L})[^a-z])"
_LOWER = r"(?:(?=\p{L})[^A-Z])"
_O200K = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_PATTERNS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^`\|~]", _GPT2),
    "gpt-2": (_GPT2,),
    "llama3": (_llama3_style("{1,3}"),),
    "qwen2": (_llama3_style(""),),
    "gpt-4o": (_O200K,),
}
# names used in GGUF files for the same pre-tokenizers
_ALIASES = {
    "gpt2": "gpt-2", "llama-bpe": "llama3", "llama-v3": "llama3",
    "deepseek-r1-qwen": "qwen2",
}  # fmt: skip

SUPPORTED_PRE = tuple(sorted(set(_PATTERNS) | set(_ALIASES)))


class PreTokenizer:
    """Splits text into words for BPE with one named pre-tokenizer's regexes."""

    def __init__(self, name: str):
        key = _ALIASES.get(name, name)
        if key not in _PATTERNS:
            raise UnsupportedModelError(
                f"unsupported BPE pre-tokenizer {name!r} (tokenizer.ggml.pre); "
                f"supported: {', '.join(SUPPORTED_PRE)}"
            )
        self.name = key
        self._regexes = [regex.compile(p) for p in _PATTERNS[key]]

    def split(self, text: str) -> list[str]:
        """The words of `text`; their concatenation is `text` itself."""
        pieces = [text] if text else []
        for rx in self._regexes:
            out: list[str] = []
            for piece in pieces:
                pos = 0
                for m in rx.finditer(piece):
                    if m.start() > pos:
                        out.append(piece[pos : m.start()])
                    out.append(m.group())
                    pos = m.end()
                if pos < len(piece):
                    out.append(piece[pos:])
            pieces = out
        return pieces
