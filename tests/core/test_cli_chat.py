"""`forge chat` through a pseudo-terminal (pexpect): the banner, /?, /clear, /bye, history
across sessions, Ctrl-C stopping a reply and Ctrl-D leaving on a clean line; and piped turns.
The tiny llama-f32 model (no chat template: the warning line names the fallback)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pexpect = pytest.importorskip("pexpect")

PROMPT = ">>>"


@pytest.fixture
def chat(golden_dir, tmp_path):
    """Start `forge chat` on a pty; returns the pexpect child (closed after the test)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm")
    children = []

    def start(*flags, model=str(golden_dir / "models" / "llama-f32.gguf")):
        argv = ["-m", "forge", "chat", model, "--backend", "cpu_simd", "--temp", "0",
                "--no-progress", *flags]  # fmt: skip
        child = pexpect.spawn(sys.executable, argv, env=env, cwd=str(tmp_path),
                              encoding="utf-8", timeout=60, dimensions=(24, 200))  # fmt: skip
        children.append(child)
        child.expect("has no chat template; using forge's built-in")
        child.expect("Type /\\? for help, /bye or Ctrl-D to leave; Ctrl-C stops a reply.")
        child.expect(PROMPT)
        return child

    yield start
    for child in children:
        child.close(force=True)


def _exit_status(child, seconds: float = 30.0):  # noqa: ANN001 - a pexpect child
    """The child's exit status once it has exited, None if it is still running after `seconds`
    or was ended by a signal. (It closed its terminal, so it is on its way out; pexpect's close()
    would kill one that takes longer than a tenth of a second, as on a loaded machine.)"""
    deadline = time.monotonic() + seconds
    while child.isalive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return None if child.isalive() else child.exitstatus


def test_commands_history_and_ctrl_d(chat):
    child = chat("-n", "4")
    child.sendline("/?")
    child.expect("/clear +forget the conversation")
    child.expect(PROMPT)
    child.sendline("/nonsense")
    child.expect("unknown command /nonsense; /\\? lists the commands")
    child.expect(PROMPT)
    child.sendline("Hello there")
    child.expect(PROMPT)  # the reply (4 tokens), then the prompt again
    child.sendline("/clear")
    child.expect("conversation cleared")
    child.expect(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    assert _exit_status(child) == 0 and child.before.endswith("\r\n")  # a clean line
    child = chat("-n", "4")  # history persists: the up arrow brings back the last line
    child.send("\x1b[A")
    child.expect("/clear")
    child.send("\x15")  # Ctrl-U: empty the line again
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    assert _exit_status(child) == 0


def test_ctrl_c_stops_a_reply_and_returns_to_the_prompt(chat, default_model_path):
    # the default model: without Ctrl-C, minutes until the context (2048) is full
    child = chat("-n", "-1", "--ignore-eos", "-c", "2048", model=default_model_path)
    child.sendline("Tell me a long story")
    child.expect("\x1b\\[\\?2004l")  # the editor let the line go: the reply is being written
    child.expect(".{20}")  # some of it has arrived
    child.sendintr()
    child.expect("\\[reply stopped\\]")
    child.expect(PROMPT)
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    assert _exit_status(child) == 0


def test_piped_turns_get_one_reply_each(golden_dir, tmp_path):
    from forge.api import load

    model = load(str(golden_dir / "models" / "llama-f32.gguf"), backend="cpu_simd")
    first = [{"role": "user", "content": "Hi"}]
    reply = model.complete(model.chat_prompt(first), max_tokens=5, temperature=0).text
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    done = subprocess.run([sys.executable, "-m", "forge", "chat",
                           str(golden_dir / "models" / "llama-f32.gguf"), "--backend", "cpu_simd",
                           "--temp", "0", "-n", "5"], input="Hi\n\n/clear\nHi\n", text=True,
                          capture_output=True, env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{reply}\n{reply}\n"  # /clear: the second turn starts afresh


def test_gpt_oss_model_chats_in_harmony(tmp_path):
    """A gpt-oss file without a template chats with forge's harmony renderer; whatever the
    random-weight model says, no harmony marker reaches the conversation's text."""
    from tests.support.moe_factory import moe_model

    path = moe_model(tmp_path / "gpt-oss.gguf", "gpt-oss")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    done = subprocess.run([sys.executable, "-m", "forge", "chat", str(path), "--backend",
                           "cpu_simd", "--temp", "0", "-n", "12"], input="Hi\nAgain\n",
                          text=True, capture_output=True, env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "using forge's built-in harmony template" in done.stderr
    assert done.stdout.count("\n") == 2 and "<|" not in done.stdout
