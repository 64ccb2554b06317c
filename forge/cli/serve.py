"""``forge serve [MODEL]``: the OpenAI-compatible HTTP server (needs the ``server`` extra).

Binds 127.0.0.1 unless --host says otherwise. The model runs in a child process (HTTP here, the
engine there: `forge.server.engine_process`) and loads in the background: /health and /ready
answer at once (503 "loading"), then 200 when the model is in. A model that fails to load ends
the process with its reason and exit status 1. SIGTERM (or Ctrl-C) stops new requests (503) and
lets the running ones finish, for up to --drain-timeout seconds, then exits 0; a second signal
exits at once (`forge.server.shutdown`).
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
                    help="require 'Authorization: Bearer KEY' (shows in ps: prefer "
                         "--api-key-file or FORGE_API_KEY)")  # fmt: skip
    add_config_flag(g, "--api-key-file", key="server.api_key_file",
                    help="read the API key from this file (its first line)")  # fmt: skip
    add_config_flag(g, "--max-body-bytes", key="server.max_body_bytes",
                    help="larger request bodies get 413 (default 4 MiB)")  # fmt: skip
    add_config_flag(g, "--drain-timeout", key="server.drain_timeout",
                    help="seconds running requests get after SIGTERM (default 30)")  # fmt: skip
    add_config_flag(g, "--max-queue", key="server.max_queue", help="waiting requests before 429")
    add_config_flag(g, "--max-batch", key="server.max_batch", help="sequences decoded together")


def serve(args: Any, ctx: Any) -> int:
    try:
        import uvicorn

        from forge.server import create_app
        from forge.server.auth import resolve_api_key, warn_if_exposed
        from forge.server.shutdown import draining_server
    except ImportError as exc:
        raise UsageError(
            f"forge serve needs the server extra ({exc.name} is missing): "
            "pip install 'forge-llm[server]'"
        ) from None
    config = ctx.config.server
    warn_if_exposed(config.host, resolve_api_key(config))

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
    server = draining_server(uvicorn, uv_config, app, config.drain_timeout)

    def stop() -> None:
        server.should_exit = True

    server.run()
    if failed:
        raise ModelLoadFailed(f"the model failed to load: {failed[0]}")
    return 1 if server.forced else 0


class ModelLoadFailed(ForgeError):
    """forge serve could not load its model (exit status 1)."""
