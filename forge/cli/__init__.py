"""The ``forge`` command line.

Commands live in the modules of this package: every module that defines
``add_parser(subparsers)`` is picked up (sorted by its ``ORDER``, then name), so a new command is a
new module and nothing here changes. A command function takes ``(args, ctx: Context)`` and returns
the exit status; see `forge.cli.common` for the helpers (`add_command`, `add_config_flag`).

Exit status: 0 ok, 2 usage or configuration error, 1 runtime error. A `ForgeError` is printed as
``forge: error: <message>`` (its ``exit_code`` is the status), never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
import traceback
import warnings
from collections.abc import Sequence

from forge import __version__
from forge.cli.common import Context, config_overrides, config_parent, setup_logging
from forge.errors import ForgeError
from forge.hookspecs import HOOK_API_VERSION

log = logging.getLogger("forge")


def command_modules() -> list:
    """The modules of this package that add commands, in menu order."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        name = f"{__name__}.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # one broken command must not take the others down
            log.warning("command module %s failed to import: %s: %s", name, type(exc).__name__, exc)
            continue
        if hasattr(module, "add_parser"):
            found.append(module)
    return sorted(found, key=lambda m: (getattr(m, "ORDER", 50), m.__name__))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forge",
        description="Run LLMs stored as GGUF files through pluggable backends.",
        parents=[config_parent()],
    )
    parser.add_argument(
        "--version", action="version", version=f"forge {__version__} (hook API {HOOK_API_VERSION})"
    )
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for module in command_modules():
        module.add_parser(subparsers)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
    log.warning("%s", message)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``forge`` console script; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help/--version (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    if not hasattr(args, "func"):
        parser.print_help(sys.stderr)
        return 2
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            ctx = Context.load(config_overrides(args), getattr(args, "config", None))
            setup_logging(ctx.config.log_level)
            return int(args.func(args, ctx) or 0)
        except ForgeError as exc:
            print(f"forge: error: {exc}", file=sys.stderr)
            return exc.exit_code
        except KeyboardInterrupt:
            print("forge: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:  # `forge ... | head`
            return 0
        except Exception:  # a bug: show it, but keep the documented exit status
            traceback.print_exc()
            print("forge: error: internal error (the traceback above is a bug)", file=sys.stderr)
            return 1
