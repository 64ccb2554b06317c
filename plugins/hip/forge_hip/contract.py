"""What forge_hip and the kernels share, read from the kernel sources themselves.

- `constants()`: kernels/contract.h's `#define`s (weight-type ids, descriptor layout, block and
  shared-memory sizes, KV formats, sampling fields), so that Python mirrors no number.
- `kernel_signatures()`: every kernel's argument signature (runtime.base's letters: p pointer,
  i int32, u uint32, q int64, f float32), read from its `FORGE_KERNEL` declaration, macro-made
  kernels included (their macros are expanded here: function-like ones with `##` pasting and
  object-like ones in parameter lists).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from forge.errors import ForgeRuntimeError
from forge_hip.sources import kernel_dir, source_names

CONTRACT_HEADER = "contract.h"

_DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)\s+(.+?)\s*$")
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


@cache
def constants(directory: str | None = None) -> dict[str, int]:
    """contract.h's `#define NAME integer-expression` values, each expression evaluated with
    the names defined before it."""
    path = Path(directory or kernel_dir()) / CONTRACT_HEADER
    values: dict[str, int] = {}
    for line in _strip_comments(path.read_text()).splitlines():
        m = _DEFINE.match(line)
        if not m:
            continue
        name, expr = m.groups()
        expr = _IDENT.sub(lambda t: str(values[t.group()]) if t.group() in values else "?", expr)
        if not re.fullmatch(r"[\d\s()+\-*/<>|&]+", expr):
            raise ForgeRuntimeError(f"{path}: {name} is not an integer expression of known names")
        values[name] = int(eval(expr.replace("/", "//"), {"__builtins__": {}}))  # digits only
    return values


# C parameter types (the last type word of a non-pointer parameter) -> signature letters.
_SCALAR_LETTERS = {"int": "i", "i32": "i", "u32": "u", "unsigned": "u", "i64": "q", "float": "f"}


@cache
def kernel_signatures(directory: str | None = None) -> dict[str, tuple[str, str]]:
    """{kernel name: (source file, signature)} of every kernel in the kernel directory."""
    out: dict[str, tuple[str, str]] = {}
    root = Path(directory or kernel_dir())
    headers, _ = _read("\n".join(p.read_text() for p in sorted(root.glob("*.h"))))
    for source in source_names(str(root)):
        for name, signature in declarations((root / source).read_text(), headers).items():
            seen = out.get(name)
            if seen is not None and seen != (source, signature):
                raise ForgeRuntimeError(
                    f"kernel {name!r} declared as {seen} and as {(source, signature)}"
                )
            out[name] = (source, signature)
    return out


def declarations(text: str, headers: dict | None = None) -> dict[str, str]:
    """{name: signature} of the FORGE_KERNEL declarations in one source's text, with the macros
    it defines and `headers` (the kernel directory's headers' macros, as `_read` gives them).

    Kernels made by macros are found by expanding every invocation of a macro whose body declares
    a kernel; both branches of an `#if` are read (a kernel declared twice must agree)."""
    own, code_text = _read(text)
    macros = {**(headers or {}), **own}
    kernel_macros = {n for n, (_, body) in macros.items() if "FORGE_KERNEL" in body}
    texts = [code_text]
    for name in kernel_macros:
        for m in re.finditer(rf"\b{name}\s*\(", code_text):
            args, _ = _balanced(code_text, m.end() - 1)
            texts.append(_apply(macros[name], args))
    found: dict[str, str] = {}
    for chunk in texts:
        for m in re.finditer(r"\bFORGE_KERNEL\b", chunk):
            name, params = _declared(chunk, m.end())
            signature = "".join(_letter(p, macros) for p in _expand_params(params, macros))
            if found.get(name, signature) != signature:
                raise ForgeRuntimeError(f"kernel {name!r} declared with two signatures")
            found[name] = signature
    return found


def _read(text: str) -> tuple[dict[str, tuple[list[str] | None, str]], str]:
    """(macros by name: (parameters or None, body), the text less preprocessor lines)."""
    text = _strip_comments(text).replace("\\\n", " ")
    macros: dict[str, tuple[list[str] | None, str]] = {}
    code = []
    for line in text.splitlines():
        m = re.match(r"\s*#\s*define\s+(\w+)(\(([^)]*)\))?\s*(.*)$", line)
        if m:
            params = [p.strip() for p in m.group(3).split(",")] if m.group(2) else None
            macros[m.group(1)] = (params, m.group(4))
        elif not line.lstrip().startswith("#"):
            code.append(line)
    return macros, "\n".join(code)


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _balanced(text: str, open_at: int) -> tuple[list[str], int]:
    """The comma-separated arguments of the parenthesis at `open_at` (top level only), and the
    index after its closing parenthesis."""
    depth, start, args = 0, open_at + 1, []
    for i in range(open_at, len(text)):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append(text[start:i].strip())
                return [a for a in args if a] if args != [""] else [], i + 1
        elif c == "," and depth == 1:
            args.append(text[start:i].strip())
            start = i + 1
    raise ForgeRuntimeError("unbalanced parentheses in a kernel declaration")


def _apply(macro: tuple[list[str] | None, str], args: list[str]) -> str:
    """A function-like macro's body with its parameters replaced (pasting `##` joins)."""
    params, body = macro
    values = dict(zip(params or [], args))
    body = _IDENT.sub(lambda t: values.get(t.group(), t.group()), body)
    return re.sub(r"\s*##\s*", "", body)


def _declared(text: str, at: int) -> tuple[str, list[str]]:
    """(name, parameter texts) of the kernel declared after FORGE_KERNEL at `at`: the first
    identifier followed by a parenthesis that is not an attribute."""
    call = re.compile(r"\b(\w+)\s*\(")
    while (m := call.search(text, at)) is not None:
        params, at = _balanced(text, m.end() - 1)
        if m.group(1) not in ("__launch_bounds__", "__attribute__"):
            return m.group(1), params
    raise ForgeRuntimeError("FORGE_KERNEL without a declaration")


def _expand_params(params: list[str], macros: dict) -> list[str]:
    """Parameters with object-like macros (whole parameter lists) expanded."""
    out: list[str] = []
    for p in params:
        macro = macros.get(p.strip())
        if macro is not None and macro[0] is None:
            out.extend(_expand_params([a.strip() for a in macro[1].split(",")], macros))
        else:
            out.append(p)
    return out


def _letter(param: str, macros: dict) -> str:
    if "*" in param:
        return "p"
    words = [w for w in _IDENT.findall(param) if w not in ("const", "__restrict__")]
    kind = words[-2] if len(words) >= 2 else ""
    if kind == "long" and words[-3:-1] == ["long", "long"]:
        return "q"
    if kind not in _SCALAR_LETTERS:
        raise ForgeRuntimeError(f"kernel parameter {param!r}: no signature letter for its type")
    return _SCALAR_LETTERS[kind]
