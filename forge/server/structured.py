"""Structured output over HTTP: OpenAI's ``response_format`` (JSON object or JSON schema) and
llama-server's ``grammar`` and ``json_schema`` fields, enforced while sampling by the
``grammar`` stage (`forge.sampling.constrained`)."""

from __future__ import annotations

import json

from forge.completions import response_format_constraint
from forge.errors import ConfigError, UsageError
from forge.sampling.constrained import compile_grammar
from forge.sampling.params import Constraint
from forge.server.errors import bad_request
from forge.server.schemas import SamplingFields


def response_constraint(body: SamplingFields) -> dict[str, str] | None:
    """The `Constraint` fields of the request (None for free text), checked here so that a
    schema or grammar llguidance cannot compile is a 400 naming its field."""
    given = [name for name in ("response_format", "grammar", "json_schema")
             if getattr(body, name) is not None]  # fmt: skip
    if len(given) > 1:
        raise bad_request(f"give one of {', '.join(given)}, not several", given[1])
    if not given:
        return None
    try:
        if body.grammar is not None:
            constraint = {"kind": "grammar", "text": body.grammar}
        elif body.json_schema is not None:
            constraint = {"kind": "json_schema", "text": json.dumps(body.json_schema)}
        else:
            rf = body.response_format.model_dump(by_alias=True, exclude_none=True)
            constraint = response_format_constraint(rf)
        if constraint is not None:
            compile_grammar(Constraint(**constraint))
    except (ConfigError, UsageError) as err:
        raise bad_request(str(err), given[0]) from None
    return constraint
