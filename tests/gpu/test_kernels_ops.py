"""RMSNorm, RoPE, gated activations, add/mul/scale and argmax against float64 NumPy references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.support.gpu_helpers import add_norm_ref, rel_err


def test_rms_norm(rt, lib, dev):
    rng = np.random.default_rng()
    rows, n, eps = 5, 1000, 1e-6
    x = rng.standard_normal((rows, n)).astype(np.float32) * 3
    w = rng.standard_normal(n).astype(np.float32)
    y = dev.poisoned(x.nbytes)
    rt.launch(lib.get("rms_norm"), (rows,), (256,), [dev.put(x), dev.put(w), y, n, eps])
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + eps) * w
    assert rel_err(dev.get(y, (rows, n)), ref) < 1e-6


def rope_ref(x, pos, n_rot, base, neox):
    out = x.astype(np.float64).copy()
    half = n_rot // 2
    inv = base ** (-2.0 * np.arange(half) / n_rot)
    for t, p in enumerate(pos):
        theta = p * inv
        c, s = np.cos(theta), np.sin(theta)
        a = np.arange(half) if neox else 2 * np.arange(half)
        b = a + half if neox else a + 1
        x0, x1 = out[t, :, a].copy(), out[t, :, b].copy()
        out[t, :, a] = x0 * c[:, None] - x1 * s[:, None]
        out[t, :, b] = x0 * s[:, None] + x1 * c[:, None]
    return out


@pytest.mark.parametrize("mode,n_rot", [("norm", 64), ("neox", 64), ("neox", 32)])
def test_rope(rt, lib, dev, mode, n_rot):
    rng = np.random.default_rng()
    T, H, D, base = 3, 5, 64, 10000.0
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    pos = rng.integers(0, 4000, size=T).astype(np.int32)
    buf = dev.put(x)
    rt.launch(lib.get(f"rope_{mode}"), (H, T), (64,), [buf, dev.put(pos), H, D, n_rot, base, 1.0])
    out = dev.get(buf, (T, H, D))
    # float32 angles of positions up to 4000 are off by ~2e-4 rad, like llama.cpp's
    assert rel_err(out, rope_ref(x, pos, n_rot, base, mode == "neox")) < 1e-3
    np.testing.assert_array_equal(out[:, :, n_rot:], x[:, :, n_rot:])


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("name", ["geglu", "swiglu", "add", "mul"])
def test_binary(rt, lib, dev, name):
    rng = np.random.default_rng()
    n = 10007
    a = rng.standard_normal(n).astype(np.float32) * 4
    b = rng.standard_normal(n).astype(np.float32)
    y = dev.poisoned(a.nbytes)
    rt.launch(lib.get(name), (20,), (128,), [dev.put(a), dev.put(b), y, n])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = {
        "geglu": gelu_tanh(a64) * b64,
        "swiglu": a64 / (1 + np.exp(-a64)) * b64,
        "add": a64 + b64,
        "mul": a64 * b64,
    }[name]
    assert rel_err(dev.get(y, (n,)), ref) < 1e-6


def test_scale_in_place(rt, lib, dev):
    rng = np.random.default_rng()
    x = rng.standard_normal(999).astype(np.float32)
    buf = dev.put(x)
    rt.launch(lib.get("scale"), (3,), (64,), [buf, buf, 0.125, x.size])
    np.testing.assert_array_equal(dev.get(buf, x.shape), x * np.float32(0.125))


@pytest.mark.parametrize("n", [1, 1000, 262145])
def test_argmax_first_of_ties(rt, lib, dev, n):
    rng = np.random.default_rng()
    rows = 3
    x = rng.standard_normal((rows, n)).astype(np.float32)
    for r in range(rows):  # plant a tie for the maximum at two random places
        i, j = sorted(rng.choice(n, size=2, replace=n < 2))
        x[r, i] = x[r, j] = 10.0 + r
    out = dev.poisoned(rows * 4)
    rt.launch(lib.get("argmax"), (rows,), (1024,), [dev.put(x), n, out])
    np.testing.assert_array_equal(dev.get(out, (rows,), np.int32), np.argmax(x, axis=1))


@pytest.mark.parametrize("n", [64, 640, 1000, 2050, 4096, 5120])
@pytest.mark.parametrize("form", ["first", "post_norm", "plain_add", "add_only"])
def test_add_norm(rt, lib, dev, n, form):
    """layer.hip's add_norm with its planned block size: the residual update (with or without
    the post-norm) and the next layer's norm, against float64."""
    from forge_hip.plan import add_norm_threads

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
