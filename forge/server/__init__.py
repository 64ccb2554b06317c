"""The OpenAI-compatible HTTP server behind ``forge serve`` (extra ``server``: FastAPI, uvicorn,
prometheus-client). Build an app with `create_app(model_or_loader, config)`."""

from forge.server.app import create_app
from forge.server.service import model_id

__all__ = ["create_app", "model_id"]
