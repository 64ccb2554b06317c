"""Which chat template a model renders with, and whether it looks made for chatting: the
one-line warning of ``forge chat`` and the template line of ``forge inspect``."""

from __future__ import annotations

from typing import Any

from forge.tokenizer.chat import (
    CHATML_TEMPLATE,
    GEMMA_TEMPLATE,
    LLAMA3_TEMPLATE,
    PLAIN_TEMPLATE,
    resolve_chat_template,
)
from forge.tokenizer.harmony import HARMONY_TEMPLATE

BUILTIN_NAMES = {GEMMA_TEMPLATE: "gemma", CHATML_TEMPLATE: "chatml",
                 LLAMA3_TEMPLATE: "llama3", HARMONY_TEMPLATE: "harmony",
                 PLAIN_TEMPLATE: "plain 'role: content'"}  # fmt: skip
# words in general.name / general.finetune of instruction-tuned releases
_TUNED = ("instruct", "chat", "-it", " it", "_it", "assistant", "rlhf", "sft", "dpo")


def fallback_name(tokenizer: Any) -> str:
    """ "forge's built-in NAME template": what a model without a template renders with."""
    return f"forge's built-in {BUILTIN_NAMES[resolve_chat_template(tokenizer)]} template"


def template_source(tokenizer: Any) -> str:
    """ "the model's own (N characters)" or "forge's built-in NAME template (the file has
    none)"."""
    if tokenizer.chat_template:
        return f"the model's own ({len(tokenizer.chat_template)} characters)"
    return f"{fallback_name(tokenizer)} (the file has none)"


def looks_instruction_tuned(metadata: dict[str, Any]) -> bool:
    """Whether the file's names say it was tuned to follow instructions (a guess: names only)."""
    text = " ".join(str(metadata.get(k, "")) for k in ("general.name", "general.finetune",
                                                        "general.basename")).lower()  # fmt: skip
    return any(word in f" {text}" for word in _TUNED)


def template_warning(model: Any) -> str | None:
    """One line for a model without a chat template or one that looks like a base model."""
    tokenizer, metadata = model.tokenizer, model.gguf.metadata
    tuned = looks_instruction_tuned(metadata)
    if tokenizer.chat_template and tuned:
        return None
    parts = []
    if not tokenizer.chat_template:
        parts.append(f"the model has no chat template; using {fallback_name(tokenizer)}")
    if not tuned:
        parts.append("it may be a base model (not instruction-tuned): replies may not follow "
                     "the conversation")  # fmt: skip
    return "; ".join(parts)
