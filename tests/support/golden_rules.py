"""The comparison rules of ../shared/golden/README.md, shared by the CPU and GPU golden tests."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def golden_path() -> Path | None:
    """../shared/golden beside the checkout, or $FORGE_GOLDEN (used on the GPU machine)."""
    env = os.environ.get("FORGE_GOLDEN")
    for cand in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "golden"]:
        if (cand / "synthetic.json").exists():
            return cand
    return None


def golden_model_files(index: str = "synthetic.json") -> list[str]:
    """File names of the golden models an index file (synthetic.json: the dense ones, moe.json:
    the mixtures of experts) holds references for; empty when the golden data is missing."""
    import json

    golden = golden_path()
    if golden is None or not (golden / index).exists():
        return []
    return sorted(m["model"] for m in json.loads((golden / index).read_text())["models"])


# (max, mean) bounds of err = |ours - ref| / std(ref row), by weight class.
BOUNDS = {"f32": (1e-3, 1e-4), "f16": (1e-2, 2e-3), "bf16": (3e-2, 1e-2), "quant": (1.5e-1, 3e-2)}
TIE = 0.1  # a greedy mismatch is a near tie if the reference token is within TIE * std of our max


def weight_class(model_file: str) -> str:
    kind = model_file.rsplit("-", 1)[-1].removesuffix(".gguf")
    return kind if kind in ("f32", "f16", "bf16") else "quant"


def logit_errors(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(worst max, worst mean) over rows of |ours - ref| / std(ref row)."""
    ref = np.asarray(ref, dtype=np.float64)
    err = np.abs(np.asarray(ours, dtype=np.float64) - ref) / ref.std(axis=1, keepdims=True)
    return float(err.max()), float(err.mean(axis=1).max())


def greedy_mismatches(rows: np.ndarray, expected: list[int]) -> list[str]:
    """Teacher-forced greedy check: rows[i] predicts expected[i]. Returns failures as text."""
    bad = []
    for i, (row, tok) in enumerate(zip(rows, expected)):
        top = int(np.argmax(row))
        if top != tok and row[top] - row[tok] > TIE * row.std():
            bad.append(f"step {i}: ours {top} ({row[top]:.3f}) vs ref {tok} ({row[tok]:.3f})")
    return bad


def decode_departures(picks: list[int], rows: np.ndarray, followed: list[int]) -> list[str]:
    """Free-running greedy check: each token decode steps picked (picks[i]) is the maximum of
    rows[i], the one-pass logits at its position computed over the continuation `followed`, up
    to a near tie; only while the picks follow `followed` (after the first pick that leaves it
    the rows no longer describe the picks' context). Returns failures as text."""
    bad = []
    for i, (tok, want) in enumerate(zip(picks, followed)):
        row = rows[i]
        if row.max() - row[tok] > TIE * row.std():
            bad.append(f"step {i}: picked {tok} ({row[tok]:.3f}), row max {row.max():.3f}")
        if tok != want:
            break
    return bad


def case_errors(model, cases: list[dict], free_running: bool = False) -> tuple[float, float]:
    """Every golden case of a model against its reference, asserting the README's per-case
    rules: the prompt's tokens as the reference's, one pass of logits over prompt and reference
    continuation, teacher-forced greedy up to near ties, and (`free_running`) greedy decode
    picking what those logits pick while it follows the continuation. Returns the worst (max,
    mean) error of the prompt rows over the cases, for the caller's bounds."""
    worst_max = worst_mean = 0.0
    for case in cases:
        assert model.tokenize(case["prompt"]) == case["tokens"], case["prompt"]
        n = len(case["tokens"])
        logits = model.logits(case["tokens"] + case["greedy"])
        assert logits.shape == (n + len(case["greedy"]), model.n_vocab), logits.shape
        mx, mean = logit_errors(logits[:n], case["logits"])
        worst_max, worst_mean = max(worst_max, mx), max(worst_mean, mean)
        bad = greedy_mismatches(logits[n - 1 : -1], case["greedy"])
        assert not bad, (case["prompt"], bad)
        if free_running:
            out = model.complete(case["tokens"], max_tokens=4, temperature=0)
            bad = decode_departures(out.tokens, logits[n - 1 :], case["greedy"])
            assert not bad, (case["prompt"], bad)
    return worst_max, worst_mean


def check_default_model(last: np.ndarray, case: dict) -> list[str]:
    """The Gemma 3 270M rules for the last prompt row; returns failures as text."""
    ref_ids = case["last_top_ids"][:10]
    ref_logits = np.asarray(case["last_top_logits"][:10])
    ours10 = np.argsort(-last)[:10]
    fails = []
    if int(ours10[0]) != ref_ids[0]:
        fails.append(f"top-1 {int(ours10[0])} != reference {ref_ids[0]}")
    overlap = len(set(ours10.tolist()) & set(ref_ids))
    if overlap < 8:
        fails.append(f"only {overlap} of the reference top-10 in ours")
    diff = float(np.abs(last[ref_ids] - ref_logits).max())
    if diff > 0.5:
        fails.append(f"reference top-10 logits differ by up to {diff:.3f} (> 0.5)")
    return fails
