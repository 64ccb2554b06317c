"""The chat-template worker process: compiles and renders Jinja templates for
`forge.tokenizer.sandbox`, which starts it as a script (``python -I <this file>``) so that it
imports nothing but the standard library and jinja2.

Templates come from model files, so they run in Jinja's immutable sandbox, set up the way Hugging
Face transformers renders chat templates (trim_blocks, lstrip_blocks, loop controls,
`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII). The process bounds what one
render may cost in memory (an address-space limit) and output; the parent bounds its time by
killing it.

Protocol over stdin/stdout: messages are a 4-byte big-endian length, then that many bytes of JSON.
The worker first sends {"ready": true}; then for each {"template", "variables", "max_output",
"memory"} it sends {"text": ...} or {"error": kind, "message": ...} with kind one of "compile",
"raised", "render", "memory", "output".
"""

import json
import os
import resource
import signal
import struct
import sys
import threading
import time
from datetime import datetime
from functools import lru_cache

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

PARENT_CHECK_S = 0.5


class TemplateRaised(Exception):
    """raise_exception() was called by the template."""


def _raise_exception(message):
    raise TemplateRaised(str(message))


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def compile_template(source):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])  # fmt: skip
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render(request):
    """The reply to one request (a dict)."""
    try:
        template = compile_template(request["template"])
    except jinja2.TemplateSyntaxError as e:
        return {"error": "compile", "message": f"{e.message} (line {e.lineno})"}
    except MemoryError:
        return {"error": "memory", "message": "compiling"}
    except Exception as e:  # noqa: BLE001 - anything the compiler raises is the template's
        return {"error": "compile", "message": f"{type(e).__name__}: {e}"}
    limit = request["max_output"]
    parts, size = [], 0
    try:
        for part in template.generate(**request["variables"]):
            if not part:
                continue
            size += len(part)
            if size > limit:
                return {"error": "output", "message": f"more than {limit} characters"}
            parts.append(part)
        return {"text": "".join(parts)}
    except TemplateRaised as e:
        return {"error": "raised", "message": str(e)}
    except MemoryError:
        parts = None
        return {"error": "memory", "message": "rendering"}
    except Exception as e:  # noqa: BLE001 - a template is arbitrary code: any failure is its own
        return {"error": "render", "message": f"{type(e).__name__}: {e}"}


def _vm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _limit_memory(extra):
    """Let this process map at most `extra` bytes more than it has now (Linux)."""
    used = _vm_bytes()
    if used:
        resource.setrlimit(resource.RLIMIT_AS, (used + extra, resource.RLIM_INFINITY))


def _read(stream):
    head = stream.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    return json.loads(stream.read(n))


def _write(stream, message):
    data = json.dumps(message).encode("ascii")
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def _exit_with_parent(parent):
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which ends this
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    _write(stdout, {"ready": True})
    while True:
        request = _read(stdin)
        if request is None:
            return
        _limit_memory(request["memory"])
        reply = render(request)
        request = None
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)
        _write(stdout, reply)


if __name__ == "__main__":
    main()
