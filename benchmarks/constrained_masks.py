"""Constrained decoding on the default model's 262,144-token vocabulary: llguidance (what forge
uses) against xgrammar (when installed), per grammar: set-up time (vocabulary, compile) and the
time of one token mask along a fixed valid document. Prints JSON, then a table.

    pip install xgrammar      # optional: pulls in torch, transformers and triton
    python benchmarks/constrained_masks.py [--reps 5]

Both libraries walk the same token ids (forge's tokenization of the document) and must allow
every one of them; a library that rejects one is reported, not timed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import time

import numpy as np

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
DOCUMENT = json.dumps({"name": "Ann Lee", "age": 31, "tags": ["a", "bb", "hello world"]})
CASES = {"json_schema": json.dumps(PERSON), "json_object": '{"type": "object"}'}


def _allowed(bits: np.ndarray, token: int) -> bool:
    return bool((int(bits[token // 32]) >> (token % 32)) & 1)


def bench_llguidance(tokenizer, ids: list[int], reps: int) -> dict:
    import llguidance

    from forge.sampling.grammar_vocab import llg_tokenizer

    t = time.perf_counter()
    vocab = llg_tokenizer(tokenizer)
    out = {"library": f"llguidance {importlib.metadata.version('llguidance')}",
           "vocab_s": time.perf_counter() - t}  # fmt: skip
    grammar = llguidance.LLMatcher.grammar_from_json_schema
    for name, schema in CASES.items():
        out[name] = _walk(lambda s=schema: llguidance.LLMatcher(vocab, grammar(s)),
                          lambda m, bits: m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes),
                          lambda m, tok: m.consume_token(tok), tokenizer, ids, reps)  # fmt: skip
    return out


def bench_xgrammar(tokenizer, ids: list[int], reps: int) -> dict | None:
    try:
        import xgrammar
    except ImportError:
        return None
    from forge.tokenizer import TokenType

    special = {TokenType.CONTROL, TokenType.UNKNOWN, TokenType.UNUSED, TokenType.UNDEFINED}
    t = time.perf_counter()
    encoded = [b"" if tokenizer.token_type(i) in special else tokenizer.token_bytes(i)
               for i in range(tokenizer.n_vocab)]  # fmt: skip
    info = xgrammar.TokenizerInfo(encoded, xgrammar.VocabType.RAW, vocab_size=tokenizer.n_vocab,
                                  stop_token_ids=sorted(tokenizer.eog_ids))  # fmt: skip
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    version = importlib.metadata.version("xgrammar")
    out = {"library": f"xgrammar {version}", "vocab_s": time.perf_counter() - t}
    for name, schema in CASES.items():
        out[name] = _walk(lambda s=schema: xgrammar.GrammarMatcher(compiler.compile_json_schema(s)),
                          lambda m, bits: m.fill_next_token_bitmask(bits),
                          lambda m, tok: m.accept_token(tok), tokenizer, ids, reps)  # fmt: skip
    return out


def _walk(make, fill, consume, tokenizer, ids: list[int], reps: int) -> dict:
    """Median set-up (grammar compiled, matcher made) and per-token mask time over `reps`
    walks of `ids`."""
    setups, masks = [], []
    for _ in range(reps):
        t = time.perf_counter()
        matcher = make()
        setups.append(time.perf_counter() - t)
        bits = np.zeros((1, (tokenizer.n_vocab + 31) // 32), np.int32)
        for token in ids:
            t = time.perf_counter()
            fill(matcher, bits)
            masks.append(time.perf_counter() - t)
            if not _allowed(bits[0], token) or not consume(matcher, token):
                return {"error": f"token {token} {tokenizer.token_bytes(token)!r} was refused"}
    return {"setup_ms": statistics.median(setups) * 1e3,
            "mask_us_median": statistics.median(masks) * 1e6,
            "mask_us_p90": float(np.percentile(masks, 90)) * 1e6}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    import forge.api
    from forge.gguf import open_gguf
    from forge.tokenizer import tokenizer_from_metadata

    tokenizer = tokenizer_from_metadata(open_gguf(forge.api.default_model_path()).metadata)
    ids = tokenizer.encode_continuation(DOCUMENT)
    results = [r for r in (bench_llguidance(tokenizer, ids, args.reps),
                           bench_xgrammar(tokenizer, ids, args.reps)) if r]  # fmt: skip
    print(json.dumps({"n_vocab": tokenizer.n_vocab, "document_tokens": len(ids),
                      "results": results}, indent=2))  # fmt: skip
    head = ("library", "vocab s", "case", "setup ms", "mask us", "p90")
    print("\n{:<20} {:>8} {:<12} {:>9} {:>8} {:>7}".format(*head))
    for r in results:
        for case in CASES:
            c = r[case]
            if "error" in c:
                print(f"{r['library']:<20} {r['vocab_s']:>8.2f} {case:<12} {c['error']}")
                continue
            print(f"{r['library']:<20} {r['vocab_s']:>8.2f} {case:<12} {c['setup_ms']:>9.2f} "
                  f"{c['mask_us_median']:>8.1f} {c['mask_us_p90']:>7.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
