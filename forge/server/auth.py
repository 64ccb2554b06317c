"""API-key authentication, checked before anything else reads the request.

`Authenticate` is plain ASGI middleware: with a key configured, a request to any path but the
open ones (/health, /ready, and /metrics when `metrics_public`) needs ``Authorization: Bearer
<key>``, or it is answered 401 before its body is read or parsed. So an unauthenticated client
cannot make the server read a large body, and /docs, /redoc and /openapi.json are covered too.

The key can come from the configuration (a flag, TOML, ``FORGE_SERVER_API_KEY`` or
``FORGE_API_KEY``) or from a file (`api_key_file`), so it need not appear in ``ps`` output.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from pathlib import Path
from typing import Any

from forge.errors import ConfigError
from forge.server.errors import APIError, api_error_response

log = logging.getLogger("forge.server")

OPEN_PATHS = frozenset({"/health", "/ready"})


def resolve_api_key(config: Any) -> str | None:
    """The key a `ServerConfig` asks for: `api_key`, or the first line of `api_key_file`."""
    if config.api_key_file is None:
        return config.api_key or None
    if config.api_key:
        raise ConfigError("set server.api_key or server.api_key_file, not both")
    path = Path(config.api_key_file)
    try:
        key = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"server.api_key_file {str(path)!r} cannot be read: {exc}") from None
    if not key or "\n" in key:
        raise ConfigError(f"server.api_key_file {str(path)!r} must hold one line: the key")
    return key


def is_loopback(host: str) -> bool:
    """True when `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def warn_if_exposed(host: str, api_key: str | None) -> None:
    if api_key is None and not is_loopback(host):
        log.warning("serving on %s without an API key: anyone who can reach this address can "
                    "use the model (set --api-key-file or FORGE_API_KEY)", host)  # fmt: skip


class Authenticate:
    """Answers 401 to requests without the key, before the app (or anything) reads them."""

    def __init__(self, app: Any, api_key: str | None, metrics_public: bool = False):
        self.app, self.key = app, api_key
        self.open = OPEN_PATHS | ({"/metrics"} if metrics_public else set())

    async def __call__(self, scope, receive, send) -> None:
        if self.key and scope["type"] == "http" and scope["path"] not in self.open:
            if not self._authorized(scope):
                headers = {"WWW-Authenticate": "Bearer", "Connection": "close"}
                err = APIError(401, "missing or invalid API key (Authorization: Bearer <key>)",
                               code="invalid_api_key", headers=headers)  # fmt: skip
                return await api_error_response(err)(scope, receive, send)
        await self.app(scope, receive, send)

    def _authorized(self, scope) -> bool:
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
        scheme, _, token = given.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(
            token.strip(), self.key.encode("utf-8")
        )
