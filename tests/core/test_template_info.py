"""Which chat template a model renders with, the one-line warning of `forge chat` for a model
without one or a base model, and `forge inspect`'s template line, on the tiny llama-f32 and
copies of it with a template and an instruction-tuned name written into the file."""

from __future__ import annotations

import json
import warnings

import pytest
from gguf import GGUFValueType as V

import forge
from forge.cli import main
from forge.tokenizer.template_info import template_warning
from tests.support.gguf_factory import rewrite_gguf

TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


@pytest.fixture(autouse=True)
def clean_env(fresh_forge_env):
    warnings.simplefilter("ignore")


def variant(golden_dir, tmp_path, name: str, template: str | None):
    kvs = [("general.name", name, V.STRING, None)]
    if template is not None:
        kvs.append(("tokenizer.chat_template", template, V.STRING, None))
    return str(rewrite_gguf(golden_dir / "models" / "llama-f32.gguf", tmp_path / f"{name}.gguf",
                            set_kv=kvs))  # fmt: skip


def test_warnings_name_the_fallback_and_a_likely_base_model(golden_dir, tmp_path):
    bare = forge.load(variant(golden_dir, tmp_path, "tiny-base", None), backend="cpu_simd")
    assert template_warning(bare) == (
        "the model has no chat template; using forge's built-in plain 'role: content' template; "
        "it may be a base model (not instruction-tuned): replies may not follow the conversation"
    )
    tuned = forge.load(variant(golden_dir, tmp_path, "Tiny-Instruct", TEMPLATE), backend="cpu_simd")
    assert template_warning(tuned) is None
    base = forge.load(variant(golden_dir, tmp_path, "tiny", TEMPLATE), backend="cpu_simd")
    assert template_warning(base).startswith("it may be a base model")


def test_inspect_says_whether_the_file_has_a_template(golden_dir, tmp_path, capsys):
    path = variant(golden_dir, tmp_path, "Tiny-Instruct", TEMPLATE)
    assert main(["inspect", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    used = f"the model's own ({len(TEMPLATE)} characters)"
    assert report["chat_template"] == {"in_file": True, "used": used}
    assert main(["inspect", str(golden_dir / "models" / "llama-f32.gguf")]) == 0
    out = capsys.readouterr().out
    assert (
        "chat template: forge's built-in plain 'role: content' template (the file has none)" in out
    )
