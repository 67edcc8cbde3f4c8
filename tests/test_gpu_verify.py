"""`numba-flash verify` on a GPU: the default (the pairs kernel='auto' runs) passes within its
budget, every registered pair passes, and the GPU's float64 truth is NumPy's."""

import time

import numpy as np
import pytest

import reference as ref
from numba_flash import registry, verify
from numba_flash.kernels import cache
from numba_flash.testing import GPU_CASES, truth
from numba_flash.testing.campaign import plan, run_checks

DEFAULT_BUDGET_S = 60         # on an H200 (README)


@pytest.mark.gpu
def test_default_verify_passes(capsys):
    t0 = time.time()
    rc = verify.main(False)
    seconds = time.time() - t0
    out = capsys.readouterr().out
    with capsys.disabled():
        print(f"\n{out.splitlines()[-1]} (default verify; budget {DEFAULT_BUDGET_S} s on an "
              f"H200)")
    assert rc == 0, "\n".join(line for line in out.splitlines() if " NO " in line)
    assert seconds < 2 * DEFAULT_BUDGET_S, f"default verify took {seconds:.0f} s"


@pytest.mark.gpu
def test_every_registered_pair_passes():
    # compiled ahead in parallel processes, as verify does: compiled one after another in this
    # process, the test ran past 250 s on an H100 (2026-12-06)
    steps = plan(GPU_CASES, kernels=sorted(registry.PAIRS))
    if cache.enabled():
        verify.compile_ahead(steps)
    rows = list(run_checks(GPU_CASES, ns=truth.namespace(), steps=steps))
    failed = [r for r in rows if not r["ok"]]
    assert {r["pair"] for r in rows} == set(registry.PAIRS)
    assert rows and not failed, "\n".join(map(str, failed))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cupy", "torch"])
def test_gpu_truth_is_numpys(name):
    try:
        ns = truth.namespace(name)
    except ValueError as e:
        pytest.skip(str(e))
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((1, 2, n, 24)) for n in (37, 29, 29, 37))
    for causal in (False, True):        # causal with Nq > Nk: fully masked rows too
        want = ref.attention_forward(q, k, v, causal=causal) + ref.attention_backward(
            dout, q, k, v, causal=causal)
        got = (truth.attention_forward(q, k, v, causal=causal, ns=ns)
               + truth.attention_backward(dout, q, k, v, causal=causal, ns=ns))
        for g, w in zip(got, want):
            assert g.dtype == np.float64 and g.shape == w.shape
            fin = np.isfinite(w)
            assert np.array_equal(np.isneginf(g), np.isneginf(w))
            assert np.abs(g[fin] - w[fin]).max() <= 1e-12 * max(1.0, np.abs(w[fin]).max())
