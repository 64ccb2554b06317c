"""`forge bench` results as llama-bench prints them: one row per test with the model's type,
size, parameters, backend, threads or device, the test (pp N / tg N) and tokens per second,
as a Markdown table (``md``), ``csv``, a ``json`` array or ``jsonl`` lines."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass
from typing import Any

FORMATS = ("md", "csv", "json", "jsonl")


@dataclass
class BenchRow:
    """One test's result (field names follow llama-bench's JSON where they exist)."""

    model_filename: str
    model_type: str  # "gemma3 Q4_K_M": architecture and file type
    model_size: int  # bytes of tensor data
    model_n_params: int
    backend: str
    n_threads: int | None  # CPU backends
    device: str | None  # GPU backends: the device's name
    n_ubatch: int  # prompt tokens a pass took (pp tests)
    n_prompt: int
    n_gen: int
    n_depth: int
    test: str  # "pp512" or "tg128"
    avg_ts: float  # tokens per second: median of the repetitions
    stddev_ts: float
    samples_ts: list[float]


def model_facts(model: Any) -> dict[str, Any]:
    """model_filename, model_type, model_size and model_n_params of a loaded model."""
    import gguf

    tensors = model.gguf.tensors.values()
    file_type = model.gguf.metadata.get("general.file_type")
    try:
        kind = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        kind = "?"
    return {"model_filename": model.path, "model_type": f"{model.spec.arch} {kind}",
            "model_size": sum(t.nbytes for t in tensors),
            "model_n_params": sum(t.n_elements for t in tensors)}  # fmt: skip


def render(rows: list[BenchRow], fmt: str) -> str:
    """The rows in `fmt` (one of FORMATS), ending with a newline."""
    if fmt == "json":
        return json.dumps([asdict(r) for r in rows], indent=2) + "\n"
    if fmt == "jsonl":
        return "".join(json.dumps(asdict(r)) + "\n" for r in rows)
    if fmt == "csv":
        out = io.StringIO()
        fields = [f for f in BenchRow.__dataclass_fields__ if f != "samples_ts"]
        writer = csv.DictWriter(out, fields, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
        return out.getvalue()
    return _markdown(rows)


def _markdown(rows: list[BenchRow]) -> str:
    gpu = any(r.device for r in rows)
    head = ["model", "size", "params", "backend", "device" if gpu else "threads", "test", "t/s"]
    body = [[r.model_type, _gib(r.model_size), _count(r.model_n_params), r.backend,
             (r.device or "-") if gpu else str(r.n_threads or "-"), r.test,
             f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}"] for r in rows]  # fmt: skip
    widths = [max(len(c) for c in col) for col in zip(head, *body)]
    right = {2, 6}  # numbers align right, as llama-bench's

    def line(cells: list[str]) -> str:
        padded = [c.rjust(w) if i in right else c.ljust(w)
                  for i, (c, w) in enumerate(zip(cells, widths))]  # fmt: skip
        return "| " + " | ".join(padded) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if i in right else "-" * w
                             for i, w in enumerate(widths)) + " |"  # fmt: skip
    return "\n".join([line(head), rule, *(line(b) for b in body)]) + "\n"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"
