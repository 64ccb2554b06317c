"""Chat templates: rendering a conversation into a prompt string with the model's Jinja template.

Templates come from GGUF metadata (`tokenizer.chat_template`) and are untrusted code, so they run
in Jinja's immutable sandbox inside a worker process with time, memory and output limits
(`forge.tokenizer.sandbox`), set up the way Hugging Face transformers renders them.
A model without a template gets a built-in one chosen by the turn tokens its vocabulary has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forge.errors import UsageError
from forge.tokenizer.harmony import HARMONY_TEMPLATE
from forge.tokenizer.sandbox import default_sandbox

# Built-in templates, used when a model ships none. Written for forge; they follow each model
# family's published turn format.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for m in messages if m['role'] == 'system' -%}"
    "{%- set ns.system = ns.system + m['content'] + '\n\n' -%}"
    "{%- endfor -%}"
    "{%- set ns.first = true -%}"
    "{%- for m in messages if m['role'] != 'system' -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{%- if ns.first and role == 'user' %}{{ ns.system }}{% endif -%}"
    "{%- set ns.first = false -%}"
    "{{ m['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif -%}"
)
CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif -%}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for m in messages -%}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' }}"
    "{{ m['content'] | trim }}{{ '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{%- endif -%}"
)
PLAIN_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for m in messages -%}{{ m['role'] + ': ' + m['content'] + '\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ 'assistant: ' }}{% endif -%}"
)
# (token whose presence picks the template, template), first match wins
_BUILTIN = (
    ("<|channel|>", HARMONY_TEMPLATE),
    ("<start_of_turn>", GEMMA_TEMPLATE),
    ("<|im_start|>", CHATML_TEMPLATE),
    ("<|start_header_id|>", LLAMA3_TEMPLATE),
)


def resolve_chat_template(tokenizer) -> str:
    """The model's own template, else a built-in one matching its vocabulary's turn tokens,
    else a plain "role: content" format."""
    if tokenizer.chat_template:
        return tokenizer.chat_template
    for token, template in _BUILTIN:
        if tokenizer.token_id(token) is not None:
            return template
    return PLAIN_TEMPLATE


def render_chat(template: str, messages: list[dict], *, add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", **extra: Any) -> str:  # fmt: skip
    """Render `messages` ([{"role": ..., "content": ...}, ...]) with a Jinja chat template.

    `extra` variables (e.g. tools, date_string) are passed to the template as well; all values
    must be JSON values. The template renders in `forge.tokenizer.sandbox`, bounded in time,
    memory and output. Raises UsageError for malformed messages and ModelError when the template
    fails to compile or render, breaks a limit, or calls raise_exception().
    """
    _check_messages(messages)
    variables = {"messages": messages, "add_generation_prompt": add_generation_prompt,
                 "bos_token": bos_token, "eos_token": eos_token, **extra}  # fmt: skip
    return default_sandbox().render(template, variables)


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise UsageError(f"messages must be a list of dicts, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise UsageError(f"messages[{i}] must be a dict with a string 'role', got {m!r:.80}")
