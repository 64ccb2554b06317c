"""Load-time checks of the hyper-parameters that size an allocation or a loop.

A GGUF file is untrusted input: a head count, a RoPE dimension or a context length that is out of
range would otherwise load and then fail inside a kernel, or allocate without end. Every value is
checked against the tensor shapes it implies and against ranges far beyond any real model, and
a violation is a `ModelError` that names the metadata key.

Reads only the basic `ModelSpec` sizes (not its parts) and the file's metadata and tensor shapes.
"""

from __future__ import annotations

from typing import Any

from forge.errors import ModelError

# Upper bounds: several times the largest published model's value, far below what would
# exhaust memory or time at load.
MAX_VOCAB = 1 << 22  # largest real vocabularies: ~262k tokens
MAX_EMBD = 1 << 17  # largest real models: 16-32k
MAX_LAYERS = 4096  # real models: at most a few hundred
MAX_HEADS = 1024  # real models: at most 128 query heads
MAX_HEAD_DIM = 4096  # real models: at most 576
MAX_FF = 1 << 20  # real models: at most ~64k
MAX_CONTEXT = 1 << 24  # 16M positions; the longest trained contexts are ~10M
MAX_EXPERTS = 4096  # real mixtures of experts: at most a few hundred


def validate_hyperparameters(gguf: Any, spec: Any) -> None:
    """Raise ModelError naming the key of the first hyper-parameter of `spec` (built from
    `gguf`) that is out of range or disagrees with the file's tensors."""
    _Checker(gguf, spec).run()


class _Checker:
    def __init__(self, gguf: Any, spec: Any):
        self.gguf, self.spec, self.arch = gguf, spec, spec.arch

    def fail(self, key: str, message: str) -> None:
        raise ModelError(f"{self.gguf.path}: metadata key {self.key(key)} {message}")

    def key(self, name: str) -> str:
        """The full key name, quoted; "tokenizer.*" keys are not per architecture."""
        return repr(name if name.startswith("tokenizer.") else f"{self.arch}.{name}")

    def at_most(self, name: str, value: int, limit: int) -> None:
        if value > limit:
            self.fail(name, f"= {value} is out of range (at most {limit})")

    def run(self) -> None:
        s = self.spec
        vocab_key = "tokenizer.ggml.tokens" if "tokenizer.ggml.tokens" in self.gguf.metadata else (
            "vocab_size")  # fmt: skip
        for name, value, limit in (
            (vocab_key, s.n_vocab, MAX_VOCAB),
            ("embedding_length", s.n_embd, MAX_EMBD),
            ("block_count", s.n_layer, MAX_LAYERS),
            ("attention.head_count", s.n_head, MAX_HEADS),
            ("attention.head_count_kv", s.n_head_kv, MAX_HEADS),
            ("attention.key_length", s.head_dim, MAX_HEAD_DIM),
            ("attention.value_length", s.head_dim_v, MAX_HEAD_DIM),
            ("context_length", s.n_ctx_train, MAX_CONTEXT),
        ):
            self.at_most(name, value, limit)
        # read from the file: where the spec keeps the FFN width depends on the FFN's kind
        for key in ("feed_forward_length", "expert_feed_forward_length"):
            n_ff = self.gguf.metadata.get(f"{self.arch}.{key}")
            if isinstance(n_ff, int) and not isinstance(n_ff, bool):
                self.at_most(key, n_ff, MAX_FF)
        self.heads()
        self.rope()
        self.windows()
        self.vocab(vocab_key)
        self.experts()

    def heads(self) -> None:
        s = self.spec
        if s.n_head_kv > s.n_head or s.n_head % s.n_head_kv:
            self.fail("attention.head_count_kv", f"= {s.n_head_kv} must divide the query head "
                      f"count {s.n_head} ({self.key('attention.head_count')})")  # fmt: skip

    def rope(self) -> None:
        s = self.spec
        if s.rope_dim > s.head_dim or s.rope_dim % 2:
            self.fail("rope.dimension_count", f"= {s.rope_dim} must be even and at most the "
                      f"head size {s.head_dim} ({self.key('attention.key_length')})")  # fmt: skip

    def windows(self) -> None:
        if len(self.spec.layers) != self.spec.n_layer:
            self.fail("block_count", f"= {self.spec.n_layer} but the spec has "
                      f"{len(self.spec.layers)} layers")  # fmt: skip
        for layer in self.spec.layers:
            window = layer.sliding_window
            if window is not None and not 1 <= window <= MAX_CONTEXT:
                self.fail("attention.sliding_window",
                          f"= {window} is out of range (1..{MAX_CONTEXT})")  # fmt: skip

    def vocab(self, key: str) -> None:
        embd = self.gguf.tensors.get("token_embd.weight")
        if embd is not None and len(embd.shape) == 2 and embd.shape[1] != self.spec.n_vocab:
            self.fail(key, f"gives {self.spec.n_vocab} tokens, but tensor 'token_embd.weight' "
                      f"has {embd.shape[1]} rows")  # fmt: skip

    def experts(self) -> None:
        count = self.optional_count("expert_count")
        used = self.optional_count("expert_used_count")
        if count is not None:
            self.at_most("expert_count", count, MAX_EXPERTS)
        if used is not None:
            if count is None:
                self.fail("expert_used_count", f"= {used} is set but {self.key('expert_count')} "
                          "is missing")  # fmt: skip
            if used > count:
                self.fail("expert_used_count", f"= {used} exceeds the expert count {count}")
        if count is None:
            return
        # the router's output size and the stacked expert weights' last dimension
        for stem, dim in (("ffn_gate_inp", 1), ("ffn_gate_exps", 2), ("ffn_up_exps", 2),
                          ("ffn_down_exps", 2)):  # fmt: skip
            for i in range(self.spec.n_layer):
                info = self.gguf.tensors.get(f"blk.{i}.{stem}.weight")
                if info is not None and (len(info.shape) <= dim or info.shape[dim] != count):
                    self.fail("expert_count", f"= {count} disagrees with tensor "
                              f"'blk.{i}.{stem}.weight' of shape {list(info.shape)}")  # fmt: skip

    def optional_count(self, name: str) -> int | None:
        full = f"{self.arch}.{name}"
        if full not in self.gguf.metadata:
            return None
        value = self.gguf.metadata[full]
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(name, f"should be an integer, got {type(value).__name__}")
        if value < 1:
            self.fail(name, f"must be >= 1, got {value}")
        return value
