"""The compiled kernels' thread pool (forge_cpu_jit.pool) when its caller is interrupted."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")


def test_an_interrupt_after_a_post_finishes_the_job_before_it_propagates(monkeypatch):
    """A KeyboardInterrupt (Ctrl-C) raised between posting a job and waiting for it: run()
    re-raises it only once every chunk has run, so no worker still reads the caller's arrays
    while the caller's frames free them."""
    from forge_cpu_jit import pool
    from forge_cpu_jit.jit import _entry, address

    p = pool.Pool(2)
    rows, k = 4096, 64
    x = np.random.default_rng(0).standard_normal((rows, k)).astype(np.float32)
    out = np.zeros_like(x)
    args = np.array(
        [address(x), rows, k, address(out), k, 0], np.int64
    )  # act_round: mode 0 keeps x
    post = pool._post

    def post_then_interrupt(*a):  # noqa: ANN002
        post(*a)
        raise KeyboardInterrupt

    monkeypatch.setattr(pool, "_post", post_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        p.run(_entry("act_round"), args, rows, 1)
    assert p.ctrl[pool.DONE] == rows and p.ctrl[pool.NEXT] >= pool.CLOSED
    np.testing.assert_array_equal(out, x)
    monkeypatch.setattr(pool, "_post", post)
    out[:] = 0
    p.run(_entry("act_round"), args, rows, 1)  # the pool takes the next job as usual
    np.testing.assert_array_equal(out, x)
