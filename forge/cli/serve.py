"""``forge serve [MODEL]``: the OpenAI-compatible HTTP server (needs the ``server`` extra).

Binds 127.0.0.1 unless --host says otherwise. The model runs in a child process (HTTP here, the
engine there: `forge.server.engine_process`) and loads in the background: /health and /ready
answer at once (503 "loading"), then 200 when the model is in. A model that fails to load ends
the process with its reason and exit status 1. SIGTERM (or Ctrl-C) stops new requests (503) and
lets the running ones finish before the process exits.
"""

from __future__ import annotations

import logging
from typing import Any

from forge.cli.common import add_command, add_config_flag
from forge.errors import ForgeError, UsageError

ORDER = 30
log = logging.getLogger("forge")


def add_parser(subparsers: Any) -> None:
    p = add_command(subparsers, "serve", serve, "serve a model over an OpenAI-compatible HTTP API")
    p.add_argument(
        "model_path", nargs="?", metavar="MODEL", help="GGUF file (default: Gemma 3 270M)"
    )
    g = p.add_argument_group("server")
    add_config_flag(g, "--host", key="server.host", help="address to bind (default 127.0.0.1)")
    add_config_flag(g, "--port", key="server.port", help="TCP port (default 8080; 0 = any free)")
    add_config_flag(g, "--api-key", key="server.api_key",
                    help="require 'Authorization: Bearer KEY' (also FORGE_API_KEY)")  # fmt: skip
    add_config_flag(g, "--max-queue", key="server.max_queue", help="waiting requests before 429")
    add_config_flag(g, "--max-batch", key="server.max_batch", help="sequences decoded together")


def serve(args: Any, ctx: Any) -> int:
    import os

    try:
        import uvicorn

        from forge.server import create_app
    except ImportError as exc:
        raise UsageError(
            f"forge serve needs the server extra ({exc.name} is missing): "
            "pip install 'forge-llm[server]'"
        ) from None
    config = ctx.config.server
    if config.api_key is None and os.environ.get("FORGE_API_KEY"):
        config = config.model_copy(update={"api_key": os.environ["FORGE_API_KEY"]})

    def loader():  # noqa: ANN202 - the engine process, its model loaded
        from forge.api import open_front
        from forge.server.engine_process import EngineProcess

        front = open_front(getattr(args, "model_path", None), config=ctx.config)
        engine = EngineProcess(front, ctx.config, max_batch=config.max_batch,
                               max_queue=config.max_queue)  # fmt: skip
        return engine.wait_ready()

    failed: list[str] = []
    app = create_app(loader, config, on_load_failure=lambda why: failed.append(why) or stop())
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, log_level="info",
                               access_log=False, lifespan="on")  # fmt: skip
    server = _draining_server(uvicorn, uv_config, app)

    def stop() -> None:
        server.should_exit = True

    server.run()
    if failed:
        raise ModelLoadFailed(f"the model failed to load: {failed[0]}")
    return 0


class ModelLoadFailed(ForgeError):
    """forge serve could not load its model (exit status 1)."""


def _draining_server(uvicorn: Any, config: Any, app: Any) -> Any:
    """uvicorn's server, made to refuse new generations (503) the moment a stop signal arrives;
    uvicorn then waits for the open responses and the app's shutdown finishes the scheduler."""

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            app.state.forge.drain()
            super().handle_exit(sig, frame)

    return Server(config)
