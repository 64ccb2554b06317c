"""Hostile chat templates (they come from model files): each costs a bounded time and memory,
then a clear ModelError, with no process or thread left running (forge.tokenizer.sandbox)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from gguf import GGUFValueType as V

from forge.errors import ModelError
from forge.tokenizer.chat import CHATML_TEMPLATE, render_chat
from forge.tokenizer.sandbox import TemplateSandbox
from tests.support.gguf_factory import rewrite_gguf, tiny_model

MESSAGES = [{"role": "user", "content": "hi"}]
NESTED_LOOPS = ("{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}"
                "{% endfor %}{% endfor %}")  # fmt: skip
DOUBLING = ("{% set ns = namespace(s='x') %}{% for i in range(64) %}"
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}")  # fmt: skip
HUGE_PRODUCT = "{{ 'x' * 10000000000 }}"
LONG_OUTPUT = "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"
RECURSION = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"


def _worker_children() -> set[int]:
    """Pids of this process's living template workers."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"_template_worker" in cmd:
            found.add(int(pid))
    return found


@pytest.fixture
def sandbox():
    box = TemplateSandbox(max_workers=1)
    yield box
    box.close()


def test_nested_loops_stop_at_the_time_budget(sandbox):
    before = _worker_children()
    assert sandbox.render(CHATML_TEMPLATE, {"messages": MESSAGES, "add_generation_prompt": True})
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"did not finish rendering within 1 s \(stopped\)"):
        sandbox.render(NESTED_LOOPS, {"messages": MESSAGES})
    assert time.monotonic() - started < 10  # the budget is 1 s; 10 guards against a hang
    # the worker that spun was killed and reaped: nothing of it is left running
    assert _worker_children() <= before
    # and the next render gets a fresh worker
    assert sandbox.render("{{ messages[0]['content'] }}", {"messages": MESSAGES}) == "hi"


@pytest.mark.parametrize("template", [DOUBLING, HUGE_PRODUCT])
def test_memory_hungry_templates_stop_at_the_memory_budget(sandbox, template):
    with pytest.raises(ModelError, match=r"needed more than 64 MiB while rendering \(stopped\)"):
        sandbox.render(template, {"messages": MESSAGES})
    assert sandbox.render("ok", {}) == "ok"


def test_output_is_capped(sandbox):
    with pytest.raises(ModelError, match=r"output has more than \d+ characters \(stopped\)"):
        sandbox.render(LONG_OUTPUT, {"messages": MESSAGES})


def test_endless_recursion_is_a_render_error(sandbox):
    with pytest.raises(ModelError, match="failed to render: RecursionError"):
        sandbox.render(RECURSION, {})


def test_peak_memory_of_a_hostile_render_is_bounded(tmp_path):
    """Measured in a fresh interpreter: the worker's peak (reaped child) and this process's."""
    script = (
        "import resource, json\n"
        "from forge.tokenizer.sandbox import TemplateSandbox\n"
        "box = TemplateSandbox()\n"
        "box.render('ok', {})\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        f"    box.render({DOUBLING!r}, {{}})\n"
        "except Exception as e:\n"
        "    error = str(e)\n"
        "box.close()\n"
        "print(json.dumps({'error': error,\n"
        "    'self_kib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before,\n"
        "    'worker_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    got = json.loads(out)
    assert "needed more than 64 MiB" in got["error"]
    assert got["worker_kib"] < 160 * 1024  # python + jinja2 (~25 MiB) + the 64 MiB budget
    assert got["self_kib"] < 16 * 1024


def test_templates_still_render_after_failures():
    with pytest.raises(ModelError):
        render_chat(NESTED_LOOPS, MESSAGES)
    assert render_chat(CHATML_TEMPLATE, MESSAGES) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_forge_chat_reports_a_hostile_template_and_exits(tmp_path):
    src = tiny_model(tmp_path / "tiny.gguf")
    hostile = ("tokenizer.chat_template", NESTED_LOOPS, V.STRING, None)
    path = rewrite_gguf(src, tmp_path / "hostile.gguf", set_kv=[hostile])
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "forge", "chat", str(path), "--backend", "cpu_simd",
                        "--no-progress"], input="hello\n", capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "forge: error: the chat template did not finish rendering within 1 s" in r.stderr
    assert "Traceback" not in r.stderr
    assert time.monotonic() - started < 60
