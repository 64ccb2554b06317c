"""``forge inspect [MODEL]``: what a GGUF file holds and what each backend would need to run it.

Shows the file header, the model spec, the metadata (long arrays and strings abbreviated), a
tensor table, totals by weight type, and per backend the memory for weights and KV cache at the
configured context. A file that parses but cannot be built into a model (unknown architecture,
missing tensor) is still shown; the command then ends with that error (status 1).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

import numpy as np

from forge.backend import kv_type_args, option_args
from forge.cli.common import Context, add_command, print_json, print_table
from forge.errors import ForgeError
from forge.kv_cache import KvTypes

ORDER = 40
MEMORY_KINDS = ("weights", "kv_cache", "workspace")


def add_parser(subparsers: Any) -> None:
    p = add_command(
        subparsers,
        "inspect",
        inspect,
        "show a model's metadata, tensors and memory needs (default model if none)",
    )
    p.add_argument(
        "model_path", nargs="?", metavar="MODEL", help="GGUF file (default: Gemma 3 270M)"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument(
        "--items", type=int, default=8, metavar="N", help="array elements to show (default 8)"
    )


def inspect(args: argparse.Namespace, ctx: Context) -> int:
    from forge.api import DEFAULT_N_CTX, default_model_path
    from forge.gguf import open_gguf
    from forge.models import build_spec
    from forge.models.weights import parameter_counts

    path = args.model_path or ctx.config.model or default_model_path()
    gguf = open_gguf(path)
    spec, spec_error = None, None
    try:
        spec = build_spec(gguf)
    except ForgeError as err:
        spec_error = err
    n_ctx = ctx.config.n_ctx or DEFAULT_N_CTX
    if spec is not None:
        n_ctx = min(n_ctx, spec.n_ctx_train)
    report = {
        "path": gguf.path,
        "file_bytes": gguf.size,
        "gguf_version": gguf.version,
        "alignment": gguf.alignment,
        "data_offset": gguf.data_offset,
        "spec": spec.model_dump(mode="json") if spec else None,
        "spec_error": str(spec_error) if spec_error else None,
        "parameters": dict(zip(("total", "active_per_token"), parameter_counts(spec)))
        if spec
        else None,
        "metadata": {k: summarize(v, args.items) for k, v in gguf.metadata.items()},
        "tensors": [
            {
                "name": t.name,
                "type": t.type,
                "shape": list(t.shape),
                "bytes": t.nbytes,
                "offset": t.offset,
            }
            for t in gguf.tensors.values()
        ],  # fmt: skip
        "totals": totals_by_type(gguf),
        "n_ctx": n_ctx,
        "kv_cache_types": [ctx.config.kv_cache_type_k, ctx.config.kv_cache_type_v],
        "memory": memory_by_backend(ctx, spec, gguf, n_ctx) if spec else {},
        "chat_template": chat_template(gguf),
    }
    if args.json:
        print_json(report)
    else:
        print_report(report, configured_n_ctx=ctx.config.n_ctx)
    if spec_error is not None:
        raise spec_error
    return 0


def chat_template(gguf: Any) -> dict[str, Any]:
    """{"in_file": bool, "used": what chat renders with} (used: None if no tokenizer)."""
    from forge.tokenizer import tokenizer_from_metadata
    from forge.tokenizer.template_info import template_source

    in_file = bool(gguf.metadata.get("tokenizer.chat_template"))
    try:
        used = template_source(tokenizer_from_metadata(gguf.metadata))
    except ForgeError as err:
        used = f"none: the tokenizer cannot be built ({err})"
    return {"in_file": in_file, "used": used}


def summarize(value: Any, items: int) -> dict[str, Any]:
    """A metadata value as {"type", "value"} (+ "length" for arrays and long strings), with
    arrays cut to their first `items` elements and strings to 200 characters."""
    if isinstance(value, np.ndarray):
        head = value[:items].tolist()
        return {"type": f"array[{value.dtype}]", "length": int(value.size), "value": head}
    if isinstance(value, list):
        kinds = {type(v).__name__ for v in value} or {"str"}
        kind = kinds.pop() if len(kinds) == 1 else "mixed"
        kind = "array" if kind == "ndarray" else kind
        head = [summarize(v, items)["value"] if not isinstance(v, str) else v
                for v in value[:items]]  # fmt: skip
        return {"type": f"array[{kind}]", "length": len(value), "value": head}
    if isinstance(value, str) and len(value) > 200:
        return {"type": "str", "length": len(value), "value": value[:200]}
    return {"type": type(value).__name__, "value": value}


def totals_by_type(gguf: Any) -> list[dict[str, Any]]:
    """Tensors, elements and bytes per weight type, largest first."""
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for t in gguf.tensors.values():
        row = acc[t.type]
        row[0] += 1
        row[1] += t.n_elements
        row[2] += t.nbytes
    rows = [{"type": k, "tensors": n, "elements": e, "bytes": b} for k, (n, e, b) in acc.items()]
    return sorted(rows, key=lambda r: -r["bytes"])


def memory_by_backend(ctx: Context, spec: Any, gguf: Any, n_ctx: int) -> dict[str, Any]:
    """{backend: {weights, kv_cache, workspace, total, available, device_free}} for every
    registered backend (estimates from `Backend.memory_needed`; errors are reported, not raised)."""
    pm = ctx.plugins
    out = {}
    for name in pm.backends:
        probe = pm.probe(name)
        row: dict[str, Any] = {
            "available": probe.available,
            "device_free": probe.devices[0].memory_free if probe.devices else None,
        }
        try:
            kv_types = KvTypes.parse(ctx.config.kv_cache_type_k, ctx.config.kv_cache_type_v)
            backend = pm.backend(name)
            extra = kv_type_args(backend.memory_needed, kv_types, name)
            extra |= option_args(backend.memory_needed,
                                 expert_cache_mb=ctx.config.cpu_expert_cache_mb,
                                 max_seqs=ctx.config.server.max_batch)  # fmt: skip
            needed = backend.memory_needed(spec, gguf, n_ctx, **extra) or {}
        except Exception as exc:  # a plugin's estimate must not take the command down
            row["error"] = f"{type(exc).__name__}: {exc}"
            out[name] = row
            continue
        row.update({k: int(needed[k]) for k in MEMORY_KINDS if k in needed})
        row["total"] = sum(int(v) for v in needed.values()) if needed else None
        out[name] = row
    return out


def print_report(r: dict[str, Any], configured_n_ctx: int | None) -> None:
    print(f"file: {r['path']} ({human(r['file_bytes'])}), GGUF v{r['gguf_version']}, "
          f"alignment {r['alignment']}, tensor data at offset {r['data_offset']}")  # fmt: skip
    s = r["spec"]
    if s:
        f = s["ffn"]
        ffn = (f"{f['n_expert']} experts ({f['n_expert_used']} used) of n_ff {f['n_ff']}"
               if f["kind"] == "experts" else f"n_ff {f['n_ff']}")  # fmt: skip
        print(f"model: {s['arch']} {s['name']!r}: {s['n_layer']} layers, n_embd {s['n_embd']}, "
              f"{s['n_head']} heads ({s['n_head_kv']} KV) of {s['head_dim']}, {ffn}, "
              f"vocab {s['n_vocab']}, trained context {s['n_ctx_train']}"
              f"{', tied output' if s['tied_output'] else ''}")  # fmt: skip
        p = r["parameters"]
        print(f"parameters: {count(p['total'])} total, {count(p['active_per_token'])} active "
              "per token")  # fmt: skip
    else:
        print(f"model: cannot be built: {r['spec_error']}")
    print(f"chat template: {r['chat_template']['used']}")
    print(f"\nmetadata ({len(r['metadata'])} keys)")
    rows = []
    for key, m in r["metadata"].items():
        kind = m["type"] + (f" x{m['length']}" if "length" in m else "")
        rows.append([key, kind, show_value(m)])
    print_table(["key", "type", "value"], rows)
    print(f"\ntensors ({len(r['tensors'])})")
    print_table(
        ["name", "type", "shape", "bytes"],
        [[t["name"], t["type"], " x ".join(map(str, t["shape"])), t["bytes"]]
         for t in r["tensors"]],
    )  # fmt: skip
    total = sum(t["bytes"] for t in r["totals"]) or 1
    print("\ntotals by type")
    print_table(
        ["type", "tensors", "elements", "bytes", "size", "share"],
        [[t["type"], t["tensors"], t["elements"], t["bytes"], human(t["bytes"]),
          f"{100 * t['bytes'] / total:.1f}%"] for t in r["totals"]],
    )  # fmt: skip
    if not s:
        return
    capped = (
        f" (configured {configured_n_ctx}, capped at the trained context)"
        if configured_n_ctx and configured_n_ctx > r["n_ctx"]
        else ""
    )
    k, v = r["kv_cache_types"]
    print(f"\nmemory needed at n_ctx {r['n_ctx']}{capped}, KV cache K {k}, V {v}")
    rows = []
    for name, m in r["memory"].items():
        cells = [human(m.get(k)) for k in (*MEMORY_KINDS, "total")]
        if "error" in m:
            cells = [f"error: {m['error']}", "", "", ""]
        elif m.get("total") is None:
            cells = ["not reported", "", "", ""]
        avail = "yes" if m["available"] else "no"
        rows.append([name, avail, *cells, human(m["device_free"])])
    print_table(["backend", "available", *MEMORY_KINDS, "total", "device free"], rows)


def show_value(m: dict[str, Any]) -> str:
    value = m["value"]
    if m["type"].startswith("array"):
        more = ", ..." if m["length"] > len(value) else ""
        return "[" + ", ".join(repr(v) for v in value) + more + "]"
    text = repr(value)
    if "length" in m:
        text = text[:60] + f"... ({m['length']} characters)"
    return text if len(text) <= 80 else text[:77] + "..."


def count(n: int) -> str:
    """A parameter count as K/M/B with three significant digits."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return str(n)


def human(n: int | None) -> str:
    """Bytes as B/KiB/MiB/GiB ("-" for None)."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"  # unreachable
