"""Request limits: the body size cap, and max_tokens clamped to what the context allows.

`LimitBody` is plain ASGI middleware (inside `forge.server.auth.Authenticate`, so only
authenticated clients get this far): a body announced larger than `max_bytes` is answered 413
before any of it is read, and a body that grows past it while being read (chunked uploads) is
answered 413 as soon as it does. The body is read here in full, then handed to the app.
"""

from __future__ import annotations

from typing import Any

from forge.server.errors import APIError, api_error_response


def _too_large(max_bytes: int) -> APIError:
    return APIError(413, f"the request body is larger than the server's limit of {max_bytes} "
                    "bytes (server.max_body_bytes)", code="request_too_large",
                    headers={"Connection": "close"})  # fmt: skip


class LimitBody:
    """Refuses request bodies larger than `max_bytes` with an OpenAI-style 413."""

    def __init__(self, app: Any, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            err = _too_large(self.max_bytes) if length.isdigit() else APIError(
                400, "invalid Content-Length header", headers={"Connection": "close"})  # fmt: skip
            return await api_error_response(err)(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client is gone: nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await api_error_response(_too_large(self.max_bytes))(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:  # then the connection's own messages (a disconnect)
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def clamp_max_tokens(state: Any, asked: int | None) -> int | None:
    """Lower `state.max_tokens` to the positions its context has left. Returns the new value
    when the client asked for more than that (`asked`), else None."""
    room = state.n_ctx - len(state.prompt)
    if state.max_tokens <= room:
        return None
    state.max_tokens = room
    return room if asked is not None and asked > room else None
