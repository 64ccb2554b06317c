"""``response_format``: structured output (JSON object or JSON schema), enforced while
sampling by the ``grammar`` stage (`forge.sampling.constrained`)."""

from __future__ import annotations

from forge.completions import response_format_constraint
from forge.errors import ConfigError, UsageError
from forge.sampling.constrained import compile_grammar
from forge.sampling.params import Constraint
from forge.server.errors import bad_request
from forge.server.schemas import SamplingFields


def response_constraint(body: SamplingFields) -> dict[str, str] | None:
    """The `Constraint` fields of ``response_format`` (None for text), checked here so that a
    schema llguidance cannot compile is a 400 naming ``response_format``."""
    if body.response_format is None:
        return None
    try:
        constraint = response_format_constraint(
            body.response_format.model_dump(by_alias=True, exclude_none=True)
        )
        if constraint is not None:
            compile_grammar(Constraint(**constraint))
    except (ConfigError, UsageError) as err:
        raise bad_request(str(err), "response_format") from None
    return constraint
