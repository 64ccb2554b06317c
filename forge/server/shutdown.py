"""Stopping ``forge serve``: drain, then a deadline, then exit 0; a second signal stops at once.

On the first SIGTERM or SIGINT the server refuses new generations (503) and stops accepting
connections; running requests go on for up to `drain_timeout` seconds, after which each one
still open ends with an error (an SSE error event, or an error response). A client that no
longer reads cannot hold the process either: uvicorn cancels what is left shortly after the
deadline. A second signal aborts every request, kills the engine and exits at once.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("forge.server")

GRACE_S = 2.0  # after the deadline, for the error events to reach the clients


def draining_server(uvicorn: Any, config: Any, app: Any, drain_timeout: float) -> Any:
    """A `uvicorn.Server` for `app` (a `create_app` app) that stops as described above. Its
    `forced` attribute says whether a second signal cut the drain short."""
    state = app.state.forge
    config.timeout_graceful_shutdown = drain_timeout + GRACE_S

    def later(fn: Any, *args: Any) -> None:
        """Run `fn(*args)` on the app's event loop (a signal handler may interrupt it)."""
        if state.loop is not None and not state.loop.is_closed():
            state.loop.call_soon_threadsafe(fn, *args)

    def abort_all(why: str) -> None:
        if n := state.abort_all(why):
            log.warning("ended %d request(s) that had not finished: %s", n, why)

    class Server(uvicorn.Server):
        forced = False

        # replaces uvicorn's: no signal is re-raised at exit (a drained server exits 0), and
        # SIGTERM as well as SIGINT forces the exit the second time
        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:
                self.force_exit = self.forced = True
                log.warning("stopping at once (second signal)")
                later(abort_all, "the server was stopped before this request finished")
                if state.service is not None:
                    later(state.service.kill)
                return
            self.should_exit = True
            state.drain()  # only flags: safe wherever the signal interrupted
            log.info("stopping: new requests are refused; running ones have %g s to finish "
                     "(a second signal stops at once)", drain_timeout)  # fmt: skip
            why = f"the server stopped and this request did not finish within {drain_timeout:g} s"
            if state.loop is not None:
                later(state.loop.call_later, drain_timeout, abort_all, why)

    return Server(config)
