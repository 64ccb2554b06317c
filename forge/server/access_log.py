"""One access-log line per request on the ``forge.server`` logger, written when the response
ends (a stream too): method, path, status, generated tokens and time, e.g.
``POST /v1/chat/completions 200 42 tokens 1.204 s``.

The endpoints name the request's generation in ``request.state.generation``; its
``finished.completion_tokens`` gives the tokens (``-`` when the request generated nothing)."""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("forge.server")


class AccessLog:
    """Plain ASGI middleware (streaming and disconnects untouched)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [0]

        async def send_logged(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        finally:
            gen = scope.get("state", {}).get("generation")
            finished = getattr(gen, "finished", None)
            tokens = finished.completion_tokens if finished is not None else "-"
            log.info("%s %s %s %s tokens %.3f s", scope["method"], scope["path"],
                     status[0] or "-", tokens, time.perf_counter() - start)  # fmt: skip
