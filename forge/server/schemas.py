"""Request bodies of the OpenAI-compatible endpoints (field names and ranges as OpenAI's API).

Unknown fields are ignored, as OpenAI's server does for fields it does not use (e.g. `user`);
fields forge cannot honour (n > 1, echo, best_of > 1) are refused with a 400 by the handlers
rather than silently dropped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
)

Finite = Annotated[float, Field(allow_inf_nan=False)]


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: StrictStr | None = None
    description: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format; llama-server's ``{"type": "json_object", "schema": ...}``
    is taken too."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")


# OpenAI fields forge does not honour yet: refused with a 400 rather than ignored
UNSUPPORTED = ("functions", "function_call", "prediction", "audio")


class SamplingFields(BaseModel):
    """Fields shared by both endpoints. None means "the server's configured default"."""

    model_config = ConfigDict(extra="allow")  # kept to refuse UNSUPPORTED; others are ignored

    model: StrictStr | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: Finite | None = Field(None, ge=0, le=2)
    top_p: Finite | None = Field(None, gt=0, le=1)
    n: StrictInt = Field(1, ge=1, le=128)
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = Field(None, ge=0, lt=2**63)
    presence_penalty: Finite | None = Field(None, ge=-2, le=2)
    frequency_penalty: Finite | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, Finite] | None = None
    # forge's extra samplers (llama.cpp's names)
    top_k: StrictInt | None = Field(None, ge=0)
    min_p: Finite | None = Field(None, ge=0, le=1)
    repeat_penalty: Finite | None = Field(None, gt=0)
    samplers: StrictStr | list[StrictStr] | None = None  # the stage chain (llama.cpp's name)
    grammar: StrictStr | None = None  # llama-server's: a GBNF (or Lark) grammar
    json_schema: dict[str, Any] | None = None  # llama-server's: the output's JSON schema
    response_format: ResponseFormat | None = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    prompt: StrictStr | list[StrictInt] | list[StrictStr]
    logprobs: StrictInt | None = Field(None, ge=0, le=20)
    echo: StrictBool = False
    best_of: StrictInt | None = Field(None, ge=1)
    suffix: StrictStr | None = None


class ContentPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: StrictStr | None = None  # the call a tool message answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


# chat template variables forge sets itself (the conversation, its tokens, the tools)
RESERVED_TEMPLATE_VARIABLES = {"messages", "add_generation_prompt", "bos_token", "eos_token",
                               "tools"}  # fmt: skip


class ChatRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None  # None: as the template's style wants
    # template variables: gpt-oss's harmony templates read reasoning_effort, Qwen3's
    # enable_thinking (as vLLM's and llama-server's chat_template_kwargs)
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _no_reserved_variables(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted(set(v or ()) & RESERVED_TEMPLATE_VARIABLES)
        if taken:
            raise ValueError(f"{', '.join(taken)} cannot be set through chat_template_kwargs")
        return v

    def template_variables(self) -> dict[str, Any]:
        """The request's own chat template variables (reasoning_effort over the same key of
        chat_template_kwargs)."""
        out = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            out["reasoning_effort"] = self.reasoning_effort
        return out

    def chat_messages(self) -> list[dict[str, Any]]:
        """Messages as the chat template wants them ("developer" is the newer "system")."""
        out = []
        for m in self.messages:
            role = "system" if m.role == "developer" else m.role
            message: dict[str, Any] = {"role": role, "content": m.text()}
            for key in ("name", "tool_calls", "tool_call_id"):
                if getattr(m, key) is not None:
                    message[key] = getattr(m, key)
            out.append(message)
        return out
