"""`SamplingParams`: the validated knobs of the sampler chain."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from forge.errors import ConfigError

Finite = Annotated[float, Field(allow_inf_nan=False)]


def _split_names(value: Any) -> Any:
    """llama.cpp's "top_k;top_p;temperature" (or a comma list) as a list of names."""
    if isinstance(value, str):
        return [name.strip() for name in value.replace(",", ";").split(";") if name.strip()]
    return value


@contextmanager
def config_errors(what: str = "sampling parameter") -> Iterator[None]:
    """Turn a pydantic ValidationError into a ConfigError that names each bad field.

    The ConfigError gets a ``fields`` attribute: the dotted names of the offending fields.
    """
    try:
        yield
    except ValidationError as exc:
        fields, parts = [], []
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"]) or "<root>"
            fields.append(name)
            got = f" (got {err['input']!r})" if "input" in err and err["type"] != "missing" else ""
            parts.append(f"{name}: {err['msg']}{got}")
        error = ConfigError(f"invalid {what}: " + "; ".join(parts))
        error.fields = fields
        raise error from None


class Constraint(BaseModel):
    """What the generated text must match; the ``grammar`` stage enforces it while sampling
    (`forge.sampling.constrained`), so every token sequence it lets through parses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["json_object", "json_schema", "grammar", "regex"]
    # json_schema: the schema as JSON text; grammar: GBNF (llama.cpp) or Lark; regex: a
    # pattern; json_object: unused (any JSON object)
    text: str = ""


class SamplingParams(BaseModel):
    """How the next token is chosen. Defaults follow llama.cpp's CLI defaults.

    Invalid values raise `forge.errors.ConfigError` naming the field (never a bare
    pydantic error), whether built with ``SamplingParams(...)`` or ``model_validate``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Each field's comment is its reference; ranges are enforced.
    temperature: Finite = Field(0.8, ge=0)  # logits are divided by it; 0 = greedy
    top_k: int = Field(40, ge=0)  # keep the k highest logits (ties at the k-th kept); 0 = off
    top_p: Finite = Field(0.95, gt=0, le=1)  # keep the smallest set of mass >= top_p; 1 = off
    min_p: Finite = Field(0.05, ge=0, le=1)  # keep tokens with p >= min_p * max p; 0 = off
    repeat_penalty: Finite = Field(1.0, gt=0)  # llama.cpp repetition penalty; 1 = off
    repeat_last_n: int = Field(64, ge=-1)  # tokens looked back for penalties; 0 = none, -1 = all
    presence_penalty: Finite = Field(0.0, ge=-2, le=2)  # OpenAI: once per token seen
    frequency_penalty: Finite = Field(0.0, ge=-2, le=2)  # OpenAI: times the token's count
    logit_bias: dict[int, float] = Field(default_factory=dict)  # token -> added; -inf bans
    seed: int | None = Field(None, ge=0)  # RNG seed; None = fresh entropy each context
    # stage names in order, optionally ending with a sampler; a string splits at ";" or ","
    # (llama.cpp's --samplers spelling)
    chain: Annotated[list[str] | None, BeforeValidator(_split_names)] = None
    constraint: Constraint | None = None  # structured output (JSON schema, grammar, regex)

    def __init__(self, **data: Any) -> None:
        with config_errors():
            super().__init__(**data)

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> SamplingParams:
        with config_errors():
            return super().model_validate(obj, *args, **kwargs)

    @field_validator("logit_bias")
    @classmethod
    def _check_bias(cls, value: dict[int, float]) -> dict[int, float]:
        for token, bias in value.items():
            if not 0 <= token < 2**31:  # (ids are int32 everywhere below)
                raise ValueError(f"token id {token} is out of range")
            if math.isnan(bias) or bias == math.inf:
                raise ValueError(f"bias of token {token} must be finite or -inf, got {bias}")
        return value
