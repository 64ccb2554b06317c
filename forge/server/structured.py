"""``response_format``: structured output (JSON object or JSON schema), enforced while
sampling by the ``grammar`` stage (`forge.sampling.constrained`)."""

from __future__ import annotations

import json

from forge.errors import ConfigError
from forge.sampling.constrained import compile_grammar
from forge.sampling.params import Constraint
from forge.server.errors import bad_request, check
from forge.server.schemas import SamplingFields


def response_constraint(body: SamplingFields) -> dict[str, str] | None:
    """The `Constraint` fields of ``response_format`` (None for text), checked here so that a
    schema llguidance cannot compile is a 400 naming ``response_format``."""
    rf = body.response_format
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        schema = rf.schema_
    else:
        spec = rf.json_schema
        check(spec is not None and spec.schema_ is not None,
              "response_format of type json_schema needs json_schema.schema",
              "response_format")  # fmt: skip
        schema = spec.schema_
    if schema is None:
        constraint = {"kind": "json_object"}
    else:
        constraint = {"kind": "json_schema", "text": json.dumps(schema)}
    try:
        compile_grammar(Constraint(**constraint))
    except ConfigError as err:
        raise bad_request(str(err), "response_format") from None
    return constraint
