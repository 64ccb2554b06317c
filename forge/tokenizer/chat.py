"""Chat templates: rendering a conversation into a prompt string with the model's Jinja template.

Templates come from GGUF metadata (`tokenizer.chat_template`) and are untrusted code, so they run
in Jinja's immutable sandbox, set up the way Hugging Face transformers renders them (trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII).
A model without a template gets a built-in one chosen by the turn tokens its vocabulary has.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from forge.errors import ModelError, UsageError

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

    `extra` variables (e.g. tools, date_string) are passed to the template as well. Raises
    UsageError for malformed messages and ModelError when the template fails to compile or
    render, or calls raise_exception().
    """
    _check_messages(messages)
    compiled = _compile(template)
    try:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, **extra)  # fmt: skip
    except _TemplateRaised as e:
        raise ModelError(f"the chat template rejected the conversation: {e}") from e
    except jinja2.TemplateError as e:
        raise ModelError(f"the chat template failed to render: {type(e).__name__}: {e}") from e
    except Exception as e:  # a template is arbitrary code: any failure is the template's
        raise ModelError(f"the chat template failed to render: {type(e).__name__}: {e}") from e


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise UsageError(f"messages must be a list of dicts, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise UsageError(f"messages[{i}] must be a dict with a string 'role', got {m!r:.80}")


class _TemplateRaised(jinja2.TemplateError):
    """raise_exception() was called by the template."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False,
            sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])  # fmt: skip
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        msg = f"the chat template does not compile: {e.message} (line {e.lineno})"
        raise ModelError(msg) from e
    except jinja2.TemplateError as e:
        raise ModelError(f"the chat template does not compile: {e}") from e
