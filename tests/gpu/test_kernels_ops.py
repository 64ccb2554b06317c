"""Gated activations and add_norm against float64 NumPy references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.support.gpu_helpers import add_norm_ref, rel_err


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("name", ["geglu", "swiglu"])
def test_binary(rt, lib, dev, name):
    rng = np.random.default_rng()
    n = 10007
    a = rng.standard_normal(n).astype(np.float32) * 4
    b = rng.standard_normal(n).astype(np.float32)
    y = dev.poisoned(a.nbytes)
    rt.launch(lib.get(name), (20,), (128,), [dev.put(a), dev.put(b), y, n])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = {"geglu": gelu_tanh(a64) * b64, "swiglu": a64 / (1 + np.exp(-a64)) * b64}[name]
    assert rel_err(dev.get(y, (n,)), ref) < 1e-6


@pytest.mark.parametrize("n", [64, 640, 1000, 2050, 4096, 5120])
@pytest.mark.parametrize("form", ["first", "post_norm", "plain_add", "add_only"])
def test_add_norm(rt, lib, dev, n, form):
    """layer.hip's add_norm with its planned block size: the residual update (with or without
    the post-norm) and the next layer's norm, against float64."""
    from forge_hip.tuning import add_norm_threads

    rng = np.random.default_rng()
    rows, eps = 3, 1e-6
    x = rng.standard_normal((rows, n)).astype(np.float32) * 2
    o = rng.standard_normal((rows, n)).astype(np.float32) * 5
    wp, wn = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    use_o, use_post, use_next = {
        "first": (False, False, True), "post_norm": (True, True, True),
        "plain_add": (True, False, True), "add_only": (True, True, False),
    }[form]  # fmt: skip
    xd, h = dev.put(x), dev.poisoned(x.nbytes)
    args = [xd, dev.put(o) if use_o else 0, dev.put(wp) if use_post else 0,
            dev.put(wn) if use_next else 0, h, n, eps]  # fmt: skip
    threads = add_norm_threads(n, rt.props.warp_size)
    assert threads * 32 >= n and threads % rt.props.warp_size == 0
    rt.launch(lib.get("add_norm"), (rows,), (threads,), args)

    x64, h64 = add_norm_ref(x, o if use_o else None, wp if use_post else None, wn, eps)
    assert rel_err(dev.get(xd, (rows, n)), x64) < 1e-6
    if use_next:
        assert rel_err(dev.get(h, (rows, n)), h64) < 1e-6
    else:
        assert np.isnan(dev.get(h, (rows, n))).all()  # untouched poison
