"""The FastAPI application: `create_app(model_or_loader, config)`.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models and POST /v1/embeddings
(501 until it exists): OpenAI's API, with JSON bodies whatever their Content-Type. GET /health
(as llama-server's: 503 ``loading`` or ``failed``, 200 ``ok``), GET /ready (200 with the model's
id once it is loaded, 503 before), GET /metrics (Prometheus text format). With an API key
configured, every route but /health and /ready (and /metrics if `metrics_public`) needs
``Authorization: Bearer <key>``, checked before the body is read (`forge.server.auth`); bodies
beyond `max_body_bytes` get 413 (`forge.server.limits`). Every request gets one access-log line
(`forge.server.access_log`).

With a loader (a callable returning a `forge.Model`, or an `EngineProcess` running the model in a
child process), the model loads in a background thread at startup so /health and /ready answer
meanwhile; with a loaded model the app is ready at once. A load that fails calls
`on_load_failure(reason)` (``forge serve`` then stops, exiting non-zero).
At shutdown the scheduler stops taking requests (503) and finishes the ones it has
(`forge.server.shutdown` ends those still open at the drain deadline).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from forge.config import ServerConfig
from forge.server import endpoints
from forge.server.access_log import AccessLog
from forge.server.auth import Authenticate, resolve_api_key
from forge.server.engine_process import EngineProcess
from forge.server.errors import APIError, install_error_handlers
from forge.server.json_body import JSONBodies
from forge.server.limits import LimitBody
from forge.server.metrics import Metrics
from forge.server.schemas import ChatRequest, CompletionRequest
from forge.server.service import Service, model_id

log = logging.getLogger("forge.server")

_ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


class _State:
    """What the routes share: the service once loaded, or why loading failed."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.service: Service | None = None
        self.load_error: str | None = None
        self.metrics = Metrics(self.stats)
        self.draining = False
        self.loop: asyncio.AbstractEventLoop | None = None  # the app's, once started

    def stats(self) -> dict[str, float]:
        return self.service.scheduler.stats() if self.service else {}

    def attach(self, loaded: Any) -> None:
        """Serve `loaded`: a forge.Model (run in this process) or an EngineProcess (its model
        runs in a child process)."""
        cfg = self.config
        model, scheduler = (loaded.model, loaded) if isinstance(loaded, EngineProcess) else (
            loaded, None)  # fmt: skip
        self.service = Service(model, max_batch=cfg.max_batch, max_queue=cfg.max_queue,
                               metrics=self.metrics, scheduler=scheduler)  # fmt: skip
        if self.draining:
            self.service.scheduler.drain()
        log.info("serving %s (id %r)", model.path, self.service.id)

    def drain(self) -> None:
        """Refuse new generations from now on (SIGTERM); running ones finish."""
        self.draining = True
        if self.service is not None:
            self.service.scheduler.drain()

    def abort_all(self, why: str) -> int:  # event loop
        """End every open generation with an error (the drain deadline passed); how many."""
        return self.service.abort_all(why) if self.service is not None else 0


class _CountRequests:
    """Counts generation requests by status (plain ASGI: streaming and disconnects untouched)."""

    def __init__(self, app: Any, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        endpoint = _ENDPOINTS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint is None:
            return await self.app(scope, receive, send)

        started = False

        async def send_counted(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        except Exception:  # answered 500 by the outermost middleware, past this one
            if not started:
                self.metrics.requests.labels(endpoint, "500").inc()
            raise


def create_app(model_or_loader: Any, config: ServerConfig | None = None,
               on_load_failure: Callable[[str], None] | None = None) -> FastAPI:  # fmt: skip
    """An app serving a loaded `forge.Model`, or the model a zero-argument loader returns."""
    config = config or ServerConfig()
    api_key = resolve_api_key(config)
    state = _State(config)

    def load_in_background(loader: Callable[[], Any]) -> None:
        try:
            state.attach(loader())
        except Exception as exc:  # reported by /health and /ready, and to on_load_failure
            log.debug("loading the model failed", exc_info=True)
            state.load_error = f"{type(exc).__name__}: {exc}"
            if on_load_failure is not None:
                on_load_failure(state.load_error)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.loop = asyncio.get_running_loop()
        if callable(model_or_loader) and not hasattr(model_or_loader, "runner"):
            threading.Thread(target=load_in_background, args=(model_or_loader,),
                             name="forge-model-loader", daemon=True).start()  # fmt: skip
        else:
            state.attach(model_or_loader)
        yield
        state.drain()
        if state.service is not None:  # (off the loop: a second stop signal must get through)
            await asyncio.to_thread(state.service.close, config.drain_timeout)

    app = FastAPI(title="forge", lifespan=lifespan)
    app.state.forge = state
    install_error_handlers(app)

    # outermost last: requests are counted, then authenticated, then their body size checked
    app.add_middleware(LimitBody, max_bytes=config.max_body_bytes)
    app.add_middleware(Authenticate, api_key=api_key, metrics_public=config.metrics_public)
    app.add_middleware(_CountRequests, metrics=state.metrics)
    app.add_middleware(JSONBodies)
    app.add_middleware(AccessLog)

    def service() -> Service:
        if state.service is None:
            message = state.load_error or "the model is still loading"
            raise APIError(503, message, "server_error", code="model_not_ready",
                           headers={"Retry-After": "1"})  # fmt: skip
        if state.draining:
            raise APIError(503, "the server is shutting down", "server_error",
                           code="shutting_down")  # fmt: skip
        return state.service

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.service is None:
            if state.load_error:
                return JSONResponse({"status": "failed", "error": state.load_error}, 503)
            return JSONResponse({"status": "loading"}, 503)
        lost = getattr(state.service.scheduler, "lost", None)  # an engine process that died
        if lost and not state.draining:
            return JSONResponse({"status": "failed", "error": lost}, 503)
        return JSONResponse({"status": "ok"})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if state.service is None:
            body = {"status": "failed" if state.load_error else "loading",
                    "error": state.load_error}  # fmt: skip
            return JSONResponse(body, 503)
        lost = getattr(state.service.scheduler, "lost", None)  # an engine process that died
        if lost and not state.draining:
            return JSONResponse({"status": "failed", "error": lost}, 503)
        return JSONResponse({"status": "ready", "model": state.service.id})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict:
        svc = service()
        entry = {"id": svc.id, "object": "model", "created": svc.created, "owned_by": "forge"}
        return {"object": "list", "data": [entry]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await endpoints.completions(service(), body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        return await endpoints.chat_completions(service(), body, request)

    @app.post("/v1/embeddings")
    async def embeddings() -> None:
        raise APIError(501, "embeddings are not supported yet", "not_implemented_error",
                       code="not_implemented")  # fmt: skip

    return app


__all__ = ["create_app", "model_id"]
