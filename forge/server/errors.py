"""OpenAI-shaped error responses: {"error": {"message", "type", "param", "code"}}.

Every failure the server reports, from malformed JSON to a full queue, goes through `api_error`
or one of the exception handlers installed by `install_error_handlers`, so clients (the official
`openai` package included) get the body shape and status codes they expect.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from forge.errors import ConfigError, ContextOverflowError, ForgeError, ModelError, UsageError
from forge.scheduler import QueueFullError, ShuttingDownError

log = logging.getLogger("forge.server")

RETRY_AFTER_S = 1  # what a 429 tells clients to wait


class APIError(Exception):
    """An error to answer with status `status` and an OpenAI-shaped body."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers


def error_body(message: str, type: str, param: str | None = None, code: str | None = None):
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def api_error_response(err: APIError) -> JSONResponse:
    body = error_body(err.message, err.type, err.param, err.code)
    return JSONResponse(body, status_code=err.status, headers=err.headers)


def from_forge_error(err: ForgeError) -> APIError:
    """The HTTP meaning of a forge error raised while handling a request."""
    if isinstance(err, QueueFullError):
        headers = {"Retry-After": str(RETRY_AFTER_S)}
        return APIError(429, str(err), "rate_limit_error", code="queue_full", headers=headers)
    if isinstance(err, ShuttingDownError):
        return APIError(503, str(err), "server_error", code="shutting_down")
    if isinstance(err, ContextOverflowError):
        return APIError(400, str(err), code="context_length_exceeded")
    if isinstance(err, ConfigError):
        fields = getattr(err, "fields", None) or [None]
        return APIError(400, str(err), param=fields[0], code="invalid_value")
    if isinstance(err, (UsageError, ModelError)):
        return APIError(400, str(err), code="invalid_request")
    return APIError(500, str(err), "server_error")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}", None
    parts, param = [], None
    for err in errors[:5]:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        # drop pydantic's union-branch names ("str", "list[int]") from the location
        loc = [p for p in loc if not (p[:1].islower() and ("[" in p or p in _TYPE_NAMES))]
        name = ".".join(loc) or "body"
        param = param or name
        parts.append(f"{name}: {err.get('msg')}")
    return "; ".join(parts), param


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "function-after", "constrained-str"}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError) -> JSONResponse:
        return api_error_response(exc)

    @app.exception_handler(ForgeError)
    async def _forge(request: Request, exc: ForgeError) -> JSONResponse:
        return api_error_response(from_forge_error(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return JSONResponse(error_body(message, "invalid_request_error", param), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        body = error_body(str(exc.detail), kind, code=None)
        return JSONResponse(body, exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error handling %s", request.url.path)
        body = error_body(f"internal error: {type(exc).__name__}", "server_error")
        return JSONResponse(body, 500)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def check(condition: Any, message: str, param: str | None = None) -> None:
    """Raise a 400 unless `condition` holds."""
    if not condition:
        raise bad_request(message, param)
