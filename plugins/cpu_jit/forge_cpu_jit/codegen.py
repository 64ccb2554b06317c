"""Code generator of `generated.py`: the per-type products and their micro-kernels.

numba has no macros and caches only functions defined in a source file, so the per-type drivers
(`mm_<type>`, `mv_<type>`, `entry_<type>`) and the unrolled micro-kernels are written out as
Python. Edit the templates here and run `python -m forge_cpu_jit.codegen` to rewrite
generated.py (a test checks that the file is what this module writes).
"""

from __future__ import annotations

from pathlib import Path

from forge_cpu_jit.unpack import BLOCK_BYTES, OFFSET_SHIFT

INT_TYPES = tuple(OFFSET_SHIFT)
SUPER_TYPES = tuple(t for t in INT_TYPES if t.endswith("_K"))  # 256-weight super-blocks
GENERATED = Path(__file__).with_name("generated.py")

_PRELUDE = '''"""The per-type products and micro-kernels (see gemm.py).

Written by codegen.py (`python -m forge_cpu_jit.codegen`): do not edit.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from forge_cpu_jit.quant import act_views
from forge_cpu_jit.simd import (
    as_f32_ptr,
    as_u8_ptr,
    dot4,
    fma,
    fmul,
    hsum,
    load_f32x16,
    load_i8x64,
    load_i32x16,
    load_u8x64,
    neg_shl,
    prefetch,
    store_f32x16,
    store_u8x64,
    to_f32,
    zeros_f32x16,
    zeros_i32x16,
)
from forge_cpu_jit.unpack import (
{chunks}
)

TILE = 16  # weight rows unpacked at a time (a multiple of 4)
PREFETCH_BYTES = 2048  # how far ahead of the row being multiplied the one-row products prefetch
_NB = {{"nogil": True, "cache": True, "error_model": "numpy"}}
_INLINE = {{**_NB, "inline": "always"}}


'''


def _micro(kind: str, mr: int, nr: int) -> list[str]:
    """A micro-kernel: mr activation rows by nr (unpacked) weight rows over nc chunks."""
    name = {"int": "_int", "min": "_intmin", "float": "_float"}[kind] + f"_{mr}x{nr}"
    args = ("wf, xf, ot, m0, r0, nc" if kind == "float"
            else "wq, ws, wm, xq, xs, xls, xsl, sh, ot, m0, r0, nc")  # fmt: skip
    lines = ["@njit(**_INLINE)", f"def {name}({args}):  # noqa: ANN001",
             f'    """ot[m0:m0+{mr}, r0:r0+{nr}]: {mr} activation rows by {nr} weight rows."""',
             ]  # fmt: skip
    for j in range(mr):
        lines.append("    " + ", ".join(f"a{j}{i}" for i in range(nr)) + " = "
                     + ", ".join("zeros_f32x16()" for _ in range(nr)))  # fmt: skip
    lines.append("    for c in range(nc):")
    for i in range(nr):
        if kind == "float":
            lines.append(f"        w{i} = load_f32x16(wf[r0 + {i}], c * 16)")
            continue
        lines.append(f"        w{i} = load_u8x64(wq[r0 + {i}], c * 64)")
        lines.append(f"        s{i} = load_f32x16(ws[r0 + {i}], c * 16)")
        if kind == "min":
            lines.append(f"        n{i} = load_f32x16(wm[r0 + {i}], c * 16)")
    for j in range(mr):
        if kind == "float":
            lines.append(f"        x{j} = load_f32x16(xf[m0 + {j}], c * 16)")
            lines += [f"        a{j}{i} = fma(w{i}, x{j}, a{j}{i})" for i in range(nr)]
            continue
        lines.append(f"        x{j}, t{j} = load_i8x64(xq[m0 + {j}], c * 64), "
                     f"load_f32x16(xs[m0 + {j}], c * 16)")  # fmt: skip
        if kind == "min":
            lines.append(f"        c{j} = zeros_i32x16()")
            lines.append(f"        l{j} = load_f32x16(xsl[m0 + {j}], c * 16)")
        else:
            lines.append(f"        c{j} = neg_shl(load_i32x16(xls[m0 + {j}], c * 16), sh)")
        for i in range(nr):
            lines.append(f"        a{j}{i} = fma(to_f32(dot4(c{j}, w{i}, x{j})), "
                         f"fmul(s{i}, t{j}), a{j}{i})")  # fmt: skip
            if kind == "min":
                lines.append(f"        a{j}{i} = fma(n{i}, l{j}, a{j}{i})")
    for j in range(mr):
        for i in range(nr):
            lines.append(f"    ot[m0 + {j}, r0 + {i}] = hsum(a{j}{i})")
    return lines + ["", ""]


def _tile_driver(t: str) -> list[str]:
    low, sh = t.lower(), OFFSET_SHIFT[t]
    mk = "_intmin" if sh < 0 else "_int"
    lines = [
        "@njit(**_NB)",
        f"def mm_{low}(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001",
        f'    """{t} weight rows n0..n1 by several activation rows (tiles unpacked to L1)."""',
        "    m_rows, kp = xq.shape",
        "    nc = kp // 64",
        "    wq = np.zeros((TILE, kp), np.uint8)",
        "    ws = np.zeros((TILE, kp // 4), np.float32)",
        "    wm = np.zeros((TILE, kp // 4 if " + ("True" if sh < 0 else "False") + " else 1), "
        "np.float32)",
        "    ot = np.empty((m_rows, TILE), np.float32)",
        "    for t in range(n0, n1, TILE):",
        "        tn = min(TILE, n1 - t)",
        "        for r in range(tn):",
        "            row = raw[t + r]",
        "            for c in range(nc):",
        f"                w, s, mn = chunk_{low}(row, c)",
        "                store_u8x64(wq[r], c * 64, w)",
        "                store_f32x16(ws[r], c * 16, s)",
    ]
    if sh < 0:
        lines.append("                store_f32x16(wm[r], c * 16, mn)")
    lines += [
        "        m = 0",
        "        while m + 4 <= m_rows:",
        "            for r in range(0, tn, 4):",
        f"                {mk}_4x4(wq, ws, wm, xq, xs, xls, xsl, {sh}, ot, m, r, nc)",
        "            m += 4",
        "        while m < m_rows:",
        "            for r in range(0, tn, 4):",
        f"                {mk}_1x4(wq, ws, wm, xq, xs, xls, xsl, {sh}, ot, m, r, nc)",
        "            m += 1",
        "        for m in range(m_rows):",
        "            for r in range(tn):",
        "                out[m, col0 + t + r] = ot[m, r]",
        "", "",
    ]  # fmt: skip
    return lines


def _chunk_step(t: str, indent: str, unpack: str) -> list[str]:
    """One chunk c of a one-row product: unpack it (`unpack`), multiply, accumulate."""
    sh = OFFSET_SHIFT[t]
    lines = [indent + "xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)"]
    lines.append(indent + ("cv = zeros_i32x16()" if sh < 0
                           else f"cv = neg_shl(load_i32x16(xlr, c * 16), {sh})"))  # fmt: skip
    lines.append(indent + f"w, s, mn = {unpack}")
    lines.append(indent + "acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)")
    if sh < 0:
        lines.append(indent + "acc = fma(mn, load_f32x16(xslr, c * 16), acc)")
    return lines


def _row_driver(t: str) -> list[str]:
    """mv: one weight row after another (one stream from memory: interleaving rows halved the
    read bandwidth), prefetching PREFETCH_BYTES ahead. A K-quant's super-block scales are
    decoded once for its four chunks."""
    low, sh, size = t.lower(), OFFSET_SHIFT[t], BLOCK_BYTES[t]
    lines = [
        "@njit(**_NB)",
        f"def mv_{low}(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001",
        f'    """{t} weight rows n0..n1 by one activation row, a row at a time."""',
        "    x, xsr, "
        + ("xslr = xq[0], xs[0], xsl[0]" if sh < 0 else "xlr = xq[0], xs[0], xls[0]"),
        "    flat = raw.reshape(raw.shape[0] * raw.shape[1])",
        "    last = flat.shape[0] - 1",
        "    for n in range(n0, n1):",
        "        row = raw[n]",
        "        ahead = n * raw.shape[1] + PREFETCH_BYTES",
        "        acc = zeros_f32x16()",
    ]  # fmt: skip
    if t not in SUPER_TYPES:
        lines += ["        for c in range(xq.shape[1] // 64):",
                  f"            prefetch(flat, min(ahead + c * {2 * size}, last))"]  # fmt: skip
        lines += _chunk_step(t, " " * 12, f"chunk_{low}(row, c)")
    else:
        lines += [f"        for b in range(raw.shape[1] // {size}):", f"            o = b * {size}"]
        lines += [f"            prefetch(flat, min(ahead + o + {at}, last))"
                  for at in range(0, size, 64)]  # fmt: skip
        lines.append(f"            h = head_{low}(row, o)")
        for j in range(4):
            lines.append(f"            c = 4 * b + {j}")
            lines += _chunk_step(t, " " * 12, f"part_{low}(row, o, {j}, h)")
    lines.append("        out[0, col0 + n] = hsum(acc)")
    return lines + ["", ""]


def _entry(t: str) -> list[str]:
    low = t.lower()
    return [
        f"def entry_{low}(args, lo, hi):  # noqa: ANN001",
        f'    """{t} weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""',
        "    a = carray(args, 12)",
        "    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))",
        "    xq, xs, xls, xsl = act_views(a[4], a[5], a[3], a[6], a[7], a[8])",
        "    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))",
        "    if a[4] == 1:",
        f"        mv_{low}(raw, xq, xs, xls, xsl, out, a[11], lo, hi)",
        "    else:",
        f"        mm_{low}(raw, xq, xs, xls, xsl, out, a[11], lo, hi)",
        "", "",
    ]  # fmt: skip


def generate() -> str:
    """The text of generated.py."""
    names = [f"chunk_{t.lower()}" for t in INT_TYPES]
    names += [f"{f}_{t.lower()}" for t in SUPER_TYPES for f in ("head", "part")]
    chunks = "\n".join(f"    {n}," for n in sorted(names))
    out = [_PRELUDE.format(chunks=chunks).rstrip("\n") + "\n\n"]
    for kind in ("int", "min", "float"):
        for mr in (4, 1):
            out += _micro(kind, mr, 4)
    for t in INT_TYPES:
        out += _tile_driver(t) + _row_driver(t) + _entry(t)
    out.append("ENTRIES = {")
    out += [f'    "{t}": entry_{t.lower()},' for t in INT_TYPES]
    out.append("}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":  # pragma: no cover - a development tool
    GENERATED.write_text(generate())
