"""Tool calling: OpenAI ``tools`` rendered into the prompt, the reply parsed into tool calls.

`plan_tools` looks at the chat template the model renders with and picks one of four styles:

- ``hermes``: the template renders ``tools`` itself and its models answer with
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen 2.5/3, Hermes);
- ``json``: the template renders ``tools`` and its models answer with a bare JSON object
  ``{"name": ..., "parameters": {...}}`` (Llama 3.x);
- ``harmony``: gpt-oss's templates (`forge.tokenizer.harmony`): the template renders ``tools``
  as a ``functions`` namespace and the model sends a call as a message to ``functions.<name>``
  on its commentary channel;
- ``generic``: the template knows nothing of tools (Gemma 3, the built-in templates): the tools
  and the answer format go into the system message, and the answer is always one JSON object,
  ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` or ``{"content": "..."}``, constrained
  by a JSON schema (small models need the help).

``tool_choice`` "required" or a named function constrains the other styles to calls of the
offered tools (arguments matching each tool's ``parameters`` schema; harmony replies are not
constrained, so it is refused there); "auto" constrains only the generic style; "none" leaves
the tools out of the prompt. `ToolPlan.parse` turns the reply into content
and `ToolCall`s.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from forge.errors import UsageError
from forge.tokenizer.harmony import is_harmony, parse_reply

GENERIC_INSTRUCTIONS = (
    "You can call these tools (JSON schemas of their arguments):\n{tools}\n\n"
    'Answer with one JSON object: {{"tool_calls": [{{"name": <tool name>, "arguments": '
    '{{...}}}}]}} to call tools, or {{"content": <your reply>}} to reply directly.'
)
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class ToolCall:
    """One call the model asked for; `arguments` is JSON text, as OpenAI sends it."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        """The call as an entry of OpenAI's ``tool_calls`` (with ``index`` in stream deltas)."""
        out = {"id": self.id, "type": "function",
               "function": {"name": self.name, "arguments": self.arguments}}  # fmt: skip
        return out if index is None else {"index": index, **out}


@dataclass
class ToolPlan:
    """How one request offers tools: what to render, what to constrain, how to parse."""

    style: str  # "generic", "hermes", "json" or "harmony"
    messages: list[dict]  # the conversation to render
    template_vars: dict[str, Any]  # extra template variables ({"tools": [...]} when native)
    constraint: dict[str, str] | None  # a `forge.sampling.params.Constraint`'s fields
    names: frozenset[str]  # the offered tools

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a finished reply; content None when the reply is only calls."""
        if self.style == "generic":
            return self._parse_generic(text)
        if self.style == "harmony":
            content, _, found = parse_reply(text)
            return (content or None), self.harmony_calls(found)
        if self.style == "hermes":
            calls = [c for block in _HERMES_BLOCK.findall(text) for c in self._calls(block)]
            rest = _HERMES_BLOCK.sub("", text).strip() if calls else text
            return (rest or None), calls
        calls = self._calls(text.strip().removeprefix("<|python_tag|>"))
        return (None, calls) if calls else (text, [])

    def harmony_calls(self, found: list[tuple[str, str]]) -> list[ToolCall]:
        """Calls of a harmony reply ((name, arguments text) pairs) to offered tools whose
        arguments are JSON."""
        calls = []
        for name, arguments in found:
            try:
                json.loads(arguments)
            except json.JSONDecodeError:
                continue
            if name in self.names:
                calls.append(ToolCall(name, arguments))
        return calls

    def _parse_generic(self, text: str) -> tuple[str | None, list[ToolCall]]:
        try:
            reply = json.loads(text)
        except json.JSONDecodeError:
            return text, []
        if isinstance(reply, dict) and isinstance(reply.get("tool_calls"), list):
            calls = [c for item in reply["tool_calls"] for c in self._calls(item)]
            if calls:
                return None, calls
        if isinstance(reply, dict) and isinstance(reply.get("content"), str):
            return reply["content"], []
        return text, []

    def _calls(self, found: Any) -> list[ToolCall]:
        """The calls in a parsed (or JSON text) object or list; names not offered are not
        calls."""
        if isinstance(found, str):
            try:
                found = json.loads(found)
            except json.JSONDecodeError:
                return []
        items = found if isinstance(found, list) else [found]
        calls = []
        for item in items:
            if not isinstance(item, dict) or item.get("name") not in self.names:
                continue
            args = item.get("arguments", item.get("parameters", {}))
            if isinstance(args, str):  # some models write the arguments as JSON text
                calls.append(ToolCall(item["name"], args))
            else:
                calls.append(ToolCall(item["name"], json.dumps(args, ensure_ascii=False)))
        return calls


def check_tools(tools: Any) -> list[dict]:
    """The request's ``tools`` as OpenAI function tools; UsageError naming the bad entry."""
    if not isinstance(tools, list) or not tools:
        raise UsageError("tools must be a non-empty list of function tools")
    seen = set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if (
            not isinstance(tool, Mapping)
            or tool.get("type") != "function"
            or not isinstance(fn, Mapping)
        ):
            raise UsageError(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}')
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise UsageError(f"tools[{i}].function.name must be 1-64 letters, digits, _ . -")
        if name in seen:
            raise UsageError(f"tools[{i}]: the tool name {name!r} is offered twice")
        seen.add(name)
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, Mapping):
            raise UsageError(f"tools[{i}].function.parameters must be a JSON schema object")
    return list(tools)


def plan_tools(template: str, messages: list[dict], tools: Any, tool_choice: Any = "auto",
               parallel: bool | None = None) -> ToolPlan | None:  # fmt: skip
    """The plan for offering `tools` to a model whose chat template is `template`, or None
    when no tools are offered (none given, or tool_choice "none"). `parallel`: whether one
    reply may hold several calls; None: yes for native styles, no for the generic one (as
    llama-server: small models asked for a list of calls tend to repeat the first)."""
    if tools is None or tool_choice == "none":
        return None
    tools = check_tools(tools)
    offered = _chosen(tools, tool_choice)
    names = frozenset(t["function"]["name"] for t in offered)
    forced = tool_choice != "auto"
    if is_harmony(template):
        if forced:
            raise UsageError("tool_choice 'required' or a named function cannot be enforced "
                             "for this model's (harmony) replies; use 'auto'")  # fmt: skip
        return ToolPlan("harmony", messages, {"tools": tools}, None, names)
    native = "tools" in template
    style = ("hermes" if "<tool_call>" in template else "json") if native else "generic"
    parallel = native if parallel is None else parallel
    if native:
        plan = ToolPlan(style, messages, {"tools": tools}, None, names)
        if forced:
            plan.constraint = _native_constraint(style, offered, parallel)
        return plan
    schema = _generic_schema(offered, parallel, allow_content=not forced)
    return ToolPlan(style, _generic_messages(messages, tools), {},
                    {"kind": "json_schema", "text": json.dumps(schema)}, names)  # fmt: skip


def _chosen(tools: list[dict], tool_choice: Any) -> list[dict]:
    """The tools a reply may call under `tool_choice` ("auto", "required" or a named one)."""
    if tool_choice in ("auto", "required"):
        return tools
    name = None
    if isinstance(tool_choice, Mapping) and isinstance(tool_choice.get("function"), Mapping):
        name = tool_choice["function"].get("name")
    if name is None:
        raise UsageError('tool_choice must be "none", "auto", "required" or '
                         '{"type": "function", "function": {"name": ...}}')  # fmt: skip
    found = [t for t in tools if t["function"]["name"] == name]
    if not found:
        raise UsageError(f"tool_choice names {name!r}, which is not among the tools")
    return found


def _call_schema(tool: dict, arguments_key: str = "arguments") -> dict:
    fn = tool["function"]
    return {"type": "object",
            "properties": {"name": {"const": fn["name"]},
                           arguments_key: fn.get("parameters") or {"type": "object"}},
            "required": ["name", arguments_key], "additionalProperties": False}  # fmt: skip


def _calls_schema(tools: list[dict], parallel: bool, arguments_key: str = "arguments") -> dict:
    calls = {"type": "array", "minItems": 1,
             "items": {"anyOf": [_call_schema(t, arguments_key) for t in tools]}}  # fmt: skip
    if not parallel:
        calls["maxItems"] = 1
    return calls


def _generic_schema(tools: list[dict], parallel: bool, allow_content: bool) -> dict:
    calls = {"type": "object", "properties": {"tool_calls": _calls_schema(tools, parallel)},
             "required": ["tool_calls"], "additionalProperties": False}  # fmt: skip
    if not allow_content:
        return calls
    content = {"type": "object", "properties": {"content": {"type": "string"}},
               "required": ["content"], "additionalProperties": False}  # fmt: skip
    return {"anyOf": [calls, content]}


def _native_constraint(style: str, tools: list[dict], parallel: bool) -> dict[str, str]:
    if style == "json":
        schema = {"anyOf": [_call_schema(t, "parameters") for t in tools]}
        return {"kind": "json_schema", "text": json.dumps(schema)}
    one = {"anyOf": [_call_schema(t) for t in tools]}
    repeat = "+" if parallel else ""
    lark = (f'start: call{repeat}\ncall: "<tool_call>\\n" %json {json.dumps(one)} '
            '"\\n</tool_call>" "\\n"?\n')  # fmt: skip
    return {"kind": "grammar", "text": lark}


def _generic_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The conversation with the tools described in its system message, earlier calls shown
    as the JSON the model writes, and tool results as user turns."""
    specs = [{"name": t["function"]["name"],
              "description": t["function"].get("description", ""),
              "parameters": t["function"].get("parameters", {"type": "object"})}
             for t in tools]  # fmt: skip
    text = GENERIC_INSTRUCTIONS.format(tools=json.dumps(specs, ensure_ascii=False, indent=1))
    out: list[dict] = []
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"],
                      "arguments": _loads(c["function"].get("arguments", "{}"))}
                     for c in m["tool_calls"]]  # fmt: skip
            content = json.dumps({"tool_calls": calls}, ensure_ascii=False)
        elif role == "tool":
            role, content = "user", f"Tool result ({m.get('tool_call_id', '')}): {content}"
        out.append({"role": role, "content": content})
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{text}"}
    else:
        out.insert(0, {"role": "system", "content": text})
    return out


def _loads(arguments: Any) -> Any:
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
