"""Request bodies are JSON whatever their Content-Type says, as llama-server takes them:
``curl -d '{...}'`` sends ``application/x-www-form-urlencoded``, and some clients send none.
Plain ASGI, so streaming responses are untouched."""

from __future__ import annotations

from typing import Any

_JSON = (b"content-type", b"application/json")


class JSONBodies:
    """Marks every POST body to the /v1/ API as JSON before FastAPI reads it."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"].startswith("/v1/")
        ):
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
            scope = {**scope, "headers": [*headers, _JSON]}
        await self.app(scope, receive, send)
