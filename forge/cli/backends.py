"""``forge backends``, ``forge plugins`` and ``forge kernels``: what the plugins provide."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from forge.cli.common import Context, add_command, print_json, print_table

ORDER = 20


def add_parser(subparsers: Any) -> None:
    p = add_command(subparsers, "backends", backends, "probe every backend and show what it found")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p = add_command(subparsers, "plugins", plugins, "list plugins, their hooks and load errors")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p = add_command(
        subparsers, "kernels", kernels, "which plugin provides each kernel, and who wins"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def backends(args: argparse.Namespace, ctx: Context) -> int:
    pm = ctx.plugins
    probes = pm.probe_all()
    if args.json:
        print_json([
            {"backend": name, "plugin": pm.backend_plugin(name), **asdict(probe),
             "details": dict(probe.details)}
            for name, probe in probes.items()
        ])  # fmt: skip
        return 0
    rows = []
    for name, probe in probes.items():
        reason = probe.reason or "-"
        for dev in probe.devices or (None,):
            device = f"{dev.index}: {dev.name}" if dev else "-"
            where = f"{dev.platform}/{dev.arch}" if dev else "-"
            rows.append([name, device, where, "yes" if probe.available else "no", reason,
                         probe.score])  # fmt: skip
    print_table(["backend", "device", "platform/arch", "available", "reason", "score"], rows)
    for name, probe in probes.items():
        for key, value in probe.details:
            print(f"  {name} {key}: {value}")
    if pm.load_errors:
        print(f"plugins with load errors: {', '.join(pm.load_errors)} (see `forge plugins`)")
    return 0


def plugins(args: argparse.Namespace, ctx: Context) -> int:
    infos = list(ctx.plugins.infos.values())
    if args.json:
        print_json([asdict(i) for i in infos])
        return 0
    rows = [
        [i.name, i.source, i.version or "-", i.status, ", ".join(i.hooks) or "-",
         "; ".join(i.errors) or "-"]
        for i in infos
    ]  # fmt: skip
    print_table(["plugin", "source", "version", "status", "hooks", "errors"], rows)
    return 0


def kernels(args: argparse.Namespace, ctx: Context) -> int:
    from forge.api import kernel_table

    table = ctx.plugins.kernels
    used = kernel_table(ctx.plugins, ctx.config)  # what runs under the config's `kernels` key
    entries = []
    for backend, op, wtype in table.keys():
        found = table.candidates(backend, op, wtype)
        winner = used.get(backend, op, wtype) or found[0]
        entries.append({
            "backend": backend, "op": op, "weight_type": wtype,
            "winner": {"plugin": winner.plugin, "priority": winner.priority},
            "candidates": [{"plugin": k.plugin, "priority": k.priority} for k in found],
        })  # fmt: skip
    if args.json:
        print_json(entries)
        return 0
    if not entries:
        print("no kernels registered")
        return 0
    rows = [
        [e["backend"], e["op"], e["weight_type"],
         f"{e['winner']['plugin']} (priority {e['winner']['priority']})",
         ", ".join(f"{c['plugin']} ({c['priority']})" for c in e["candidates"]
                   if c != e["winner"]) or "-"]
        for e in entries
    ]  # fmt: skip
    print_table(["backend", "op", "type", "winner", "also provided by"], rows)
    if ctx.config.kernels == "builtin":
        print(
            f'kernels = "builtin" ({ctx.sources.get("kernels", "config")}): each backend runs '
            "its own plugin's kernels"
        )
    return 0
