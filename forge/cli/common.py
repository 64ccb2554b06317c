"""Helpers shared by the CLI command modules: config flags, the command context, output."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from forge.config import Config, load_config

_CFG = "cfg:"  # dest prefix of flags that set config keys: "cfg:<key>:<flag>"


def add_config_flag(parser: argparse.ArgumentParser, *flags: str, key: str, **kw: Any) -> None:
    """Add a flag that sets config key `key` (dotted, e.g. "sampling.temperature").

    Its value goes through the config's validation (so a wrong type names the flag); leave
    ``type`` out: pydantic parses the string.
    """
    kw.setdefault("metavar", key.rsplit(".", 1)[-1].upper())
    parser.add_argument(*flags, dest=f"{_CFG}{key}:{flags[-1]}", default=argparse.SUPPRESS, **kw)


def config_parent() -> argparse.ArgumentParser:
    """The flags every command accepts (before or after the command name)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("configuration")
    g.add_argument(
        "--config",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="TOML config file (default: $FORGE_CONFIG, else ./forge.toml)",
    )
    add_config_flag(g, "--backend", key="backend", help='backend name or "auto"')
    add_config_flag(
        g, "--fallback", key="fallback", help="backend to use if --backend is unavailable"
    )
    add_config_flag(g, "--device", key="device", help="device index within the backend")
    add_config_flag(g, "-tp", "--tensor-parallel", key="tensor_parallel",
                    help="devices to split the model over (tensor parallelism)")  # fmt: skip
    add_config_flag(g, "-m", "--model", key="model", help="GGUF model path")
    add_config_flag(g, "-c", "--ctx-size", "--n-ctx", key="n_ctx", help="context window in tokens")
    add_config_flag(g, "-t", "--threads", key="threads", help="CPU threads")
    add_config_flag(g, "-ctk", "--cache-type-k", key="kv_cache_type_k",
                    help="KV cache type for K: auto, f32, f16, bf16, q8_0, q4_0")  # fmt: skip
    add_config_flag(g, "-ctv", "--cache-type-v", key="kv_cache_type_v",
                    help="KV cache type for V: auto, f32, f16, bf16, q8_0, q4_0")  # fmt: skip
    add_config_flag(
        g,
        "--kernels",
        key="kernels",
        help='"auto" (the highest-priority kernels) or "builtin" (each backend\'s own: NumPy on '
        "cpu_simd)",
    )
    add_config_flag(
        g, "--log-level", key="log_level", help="debug, info, warning, error or critical"
    )
    return p  # fmt: skip


def config_overrides(args: argparse.Namespace) -> dict[str, tuple[Any, str]]:
    """{key: (value, flag)} of the config flags given on the command line."""
    found = {}
    for dest, value in vars(args).items():
        if dest.startswith(_CFG):
            key, flag = dest[len(_CFG) :].split(":", 1)
            found[key] = (value, flag)
    return found


def add_command(subparsers: Any, name: str, func: Any, help: str, **kw: Any) -> Any:
    """Add a subcommand that runs ``func(args, ctx) -> int`` and accepts the config flags."""
    parser = subparsers.add_parser(
        name, help=help, description=kw.pop("description", help), parents=[config_parent()], **kw
    )
    parser.set_defaults(func=func)
    return parser


@dataclass
class Context:
    """What a command gets besides its arguments: the config and, on demand, the plugins."""

    config: Config
    sources: dict[str, str] = field(default_factory=dict)  # dotted key -> where its value came from

    @classmethod
    def load(cls, overrides: dict[str, tuple[Any, str]], config_path: str | None) -> Context:
        config, sources = load_config(
            {k: v for k, (v, _) in overrides.items()},
            config_path,
            flag_names={k: f for k, (_, f) in overrides.items()},
        )
        return cls(config, sources)

    @property
    def plugins(self):  # noqa: ANN201 - PluginManager, imported lazily to keep --help fast
        from forge.plugins import get_plugin_manager

        return get_plugin_manager()

    def select_backend(self) -> tuple[str, str]:
        """(backend, reason) for this config; logs the choice in one line."""
        return self.plugins.select_backend(self.config)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is now (tests swap it)."""

    @property
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"forge: {level}{record.getMessage()}"


def setup_logging(level: str) -> None:
    """Send the "forge" logger to stderr at `level` (the handler is added once per process)."""
    logger = logging.getLogger("forge")
    logger.setLevel(level.upper())
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(_Formatter())
        logger.addHandler(handler)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print rows as aligned columns under a header line."""
    cells = [[str(c) for c in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)
