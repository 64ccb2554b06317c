"""`forge run`: where the prompt comes from, llama.cpp's flags, structured output, and inputs
checked before the model loads. The tiny llama-f32 model; greedy output is compared with the
Python API on the same prompt."""

from __future__ import annotations

import io
import json
import re
import warnings

import pytest

import forge.api
from forge.cli import main

MODEL = "llama-f32"


@pytest.fixture(autouse=True)
def clean_env(fresh_forge_env):
    warnings.simplefilter("ignore")


@pytest.fixture(scope="module")
def model_path(golden_dir):
    return str(golden_dir / "models" / f"{MODEL}.gguf")


@pytest.fixture(scope="module")
def ref(model_path):
    return forge.api.load(model_path, backend="cpu_simd", n_ctx=256)


def run(capsys, monkeypatch, *argv, stdin: str | None = None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def greedy(ref, prompt: str, n: int) -> str:
    return ref.complete(prompt, max_tokens=n, temperature=0).text


def test_prompt_from_flag_file_and_stdin(capsys, monkeypatch, model_path, ref, tmp_path):
    want = greedy(ref, "Once upon a time", 6) + "\n"
    common = (model_path, "--backend", "cpu_simd", "-n", "6", "--temp", "0", "-c", "256")
    assert run(capsys, monkeypatch, "run", *common, "-p", "Once upon a time")[:2] == (0, want)
    (tmp_path / "p.txt").write_text("Once upon a time")
    assert run(capsys, monkeypatch, "run", *common, "-f", str(tmp_path / "p.txt"))[:2] == (0, want)
    got = run(capsys, monkeypatch, "run", *common, stdin="Once upon a time")
    assert got[:2] == (0, want)
    got = run(capsys, monkeypatch, "run", *common, "-p", "-", stdin="Once upon a time")
    assert got[:2] == (0, want)


def test_no_prompt_says_how_to_give_one(capsys, monkeypatch, model_path):
    code, out, err = run(capsys, monkeypatch, "run", model_path, stdin="")
    assert code == 2 and out == ""
    assert "no prompt" in err and "-p" in err and "-f FILE" in err and "standard input" in err


def test_n_minus_one_runs_to_the_end_of_the_context(capsys, monkeypatch, model_path):
    small = forge.api.load(model_path, backend="cpu_simd", n_ctx=32)
    want = small.complete("Hi", max_tokens=-1, temperature=0)
    assert want.finish_reason == "stop" or want.prompt_tokens + len(want.tokens) == 32
    argv = ("run", model_path, "--backend", "cpu_simd", "-p", "Hi", "-n", "-1", "--temp", "0")
    assert run(capsys, monkeypatch, *argv, "-c", "32")[:2] == (0, want.text + "\n")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["-n", "0"], "max_tokens"),
        (["-n", "-2"], "max_tokens"),
        (["--temp", "-1"], "temperature"),
        (["-c", "8"], "n_ctx"),
        (["-t", "0"], "threads"),
        (["--repeat-last-n", "-5"], "repeat_last_n"),
        (["--samplers", "top_k;nope"], "unknown sampler stage 'nope'"),
        (["--json-schema", '{"type": "bogus"}'], "Invalid type: bogus"),
        (["--grammar", "/no/such/file"], "--grammar /no/such/file: cannot read it"),
        (["-f", "/no/such/file", "-p", "x"], "not both"),
    ],
)
def test_bad_values_fail_before_the_model_loads(capsys, monkeypatch, model_path, argv, words):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(forge.api, "load", no_load)
    prompt = [] if "-f" in argv else ["-p", "x"]
    code, out, err = run(capsys, monkeypatch, "run", model_path, *prompt, *argv)
    assert code == 2 and out == "" and words in err and "Traceback" not in err


def test_json_schema_output_parses(capsys, monkeypatch, model_path, tmp_path):
    props = {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}}
    schema = {"type": "object", "properties": props, "required": ["ok", "n"],
              "additionalProperties": False}  # fmt: skip
    (tmp_path / "s.json").write_text(json.dumps(schema))
    file = str(tmp_path / "s.json")
    code, out, err = run(capsys, monkeypatch, "run", model_path, "--backend", "cpu_simd", "-p",
                         "Answer:", "--json-schema", file, "--seed", "3")  # fmt: skip
    assert code == 0
    reply = json.loads(out)
    assert isinstance(reply["ok"], bool) and reply["n"] in (1, 2, 3) and set(reply) == {"ok", "n"}
    gbnf = tmp_path / "g.gbnf"
    gbnf.write_text('root ::= ("yes" | "no") "!"')
    code, out, err = run(capsys, monkeypatch, "run", model_path, "--backend", "cpu_simd", "-p",
                         "Answer:", "--grammar", str(gbnf))  # fmt: skip
    assert code == 0 and re.fullmatch(r"(yes|no)!\n", out)


def test_a_plugin_stage_chosen_by_samplers_flag_and_config(capsys, monkeypatch, model_path,
                                                           tmp_path):  # fmt: skip
    """The example plugin's stage (negates the logits: greedy then picks the least likely
    token) chosen by --samplers, and by sampling.chain in the config file."""
    pytest.importorskip(
        "forge_plugin_example", reason="pip install -e examples/forge-plugin-example"
    )
    ref = forge.api.load(model_path, backend="cpu_simd", n_ctx=256)
    want = ref.complete("Hello", max_tokens=4, chain=["example_invert", "greedy"]).text
    assert want != ref.complete("Hello", max_tokens=4, temperature=0).text
    argv = ("run", model_path, "--backend", "cpu_simd", "-p", "Hello", "-n", "4")
    assert run(capsys, monkeypatch, *argv, "--samplers", "example_invert;greedy")[:2] == (
        0, want + "\n")  # fmt: skip
    (tmp_path / "forge.toml").write_text('[sampling]\nchain = "example_invert;greedy"\n')
    assert run(capsys, monkeypatch, *argv, "--config", str(tmp_path / "forge.toml"))[:2] == (
        0, want + "\n")  # fmt: skip


def test_the_bar_starts_after_the_backend_line_at_the_real_count(monkeypatch, model_path):
    """On a terminal the loading bar appears once the backend is chosen (its log line comes
    first, never inside the bar) and starts at the backend's real count (cpu_simd: the layers
    and the output head), not at a placeholder."""
    import logging
    import types

    import tqdm

    from forge.cli.common import Context
    from forge.cli.generation_flags import load_model

    events = []

    class Bar:
        def __init__(self, total, **kwargs):
            events.append(("bar", total))
            self.n = 0

        def refresh(self):
            events.append(("update", self.n))

        def close(self):
            events.append(("close",))

    class Record(logging.Handler):
        def emit(self, record):
            events.append(("log", record.getMessage()))

    handler, logger = Record(), logging.getLogger("forge")
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "level", logging.INFO)
    monkeypatch.setattr(tqdm, "tqdm", Bar)
    monkeypatch.setattr("sys.stderr", types.SimpleNamespace(isatty=lambda: True, write=print))
    try:
        ctx = Context.load({"backend": ("cpu_simd", "--backend")}, None)
        model = load_model(types.SimpleNamespace(model_path=model_path, no_progress=False), ctx)
    finally:
        logger.removeHandler(handler)
    kinds = [e[0] for e in events]
    first_bar = kinds.index("bar")
    assert "log" in kinds[:first_bar] and "log" not in kinds[first_bar:]
    assert events[first_bar] == ("bar", model.spec.n_layer + 1)
    assert events[-2:] == [("update", model.spec.n_layer + 1), ("close",)]
