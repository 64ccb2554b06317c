"""``forge config``: the effective configuration and where each value came from."""

from __future__ import annotations

import argparse
from typing import Any

from forge.cli.common import Context, add_command, print_json, print_table
from forge.config import SECRET_KEYS, effective_items, find_config_file

ORDER = 30


def add_parser(subparsers: Any) -> None:
    p = add_command(subparsers, "config", show_config, "show the effective config and its sources")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def show_config(args: argparse.Namespace, ctx: Context) -> int:
    items = effective_items(ctx.config)
    for key in SECRET_KEYS:  # whether it is set, never its value
        if items.get(key) is not None:
            items[key] = "(set)"
    if args.json:
        print_json({k: {"value": v, "source": ctx.sources[k]} for k, v in items.items()})
        return 0
    path, how = find_config_file(getattr(args, "config", None))
    print(f"config file: {path} (from {how})" if path else "config file: none")
    print_table(["key", "value", "source"], [[k, v, ctx.sources[k]] for k, v in items.items()])
    return 0
