"""The reference's array-namespace path (what computes float64 truth on a GPU) run on the
CPU with NumPy behind a namespace that has only the names the reference may use, so that it
cannot rot where CI has no GPU: it must give NumPy's answer bit for bit."""

import types

import numpy as np
import pytest

import reference as ref
from numba_flash.testing import truth
from numba_flash.testing.tolerance import (backward_truth, check_backward, check_forward,
                                           forward_truth)


# NumPy through the names reference.attention documents for xp, and no others
ONLY = truth.Namespace("numpy (names only)", types.SimpleNamespace(
    swapaxes=np.swapaxes, where=np.where, exp=np.exp, log=np.log, amax=np.amax, sum=np.sum,
    arange=np.arange), np.asarray, np.asarray)


def inputs(causal_masked_rows=False, seed=0):
    rng = np.random.default_rng(seed)
    nq, nk = (9, 4) if causal_masked_rows else (7, 11)
    q, k, v, dout = (rng.standard_normal((2, 3, n, 5)) for n in (nq, nk, nk, nq))
    return q * 30, k, v, dout


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True], ids=["", "fully masked rows"])
def test_namespace_path_equals_numpy_bit_for_bit(causal, masked):
    q, k, v, dout = inputs(masked)
    want = ref.attention_forward(q, k, v, causal=causal) + ref.attention_backward(
        dout, q, k, v, causal=causal)
    got = (truth.attention_forward(q, k, v, causal=causal, ns=ONLY)
           + truth.attention_backward(dout, q, k, v, causal=causal, ns=ONLY))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    if masked and causal:
        assert np.isneginf(got[1]).any()              # lse of the masked rows


def test_truth_in_another_namespace_gives_the_same_comparisons():
    # float64 truth (float32 inputs) moves to the namespace; long double truth stays in NumPy
    q, k, v, dout = (a.astype(np.float32) for a in inputs())
    out, lse = ref.attention_forward(q, k, v)
    grads = ref.attention_backward(dout, q, k, v)
    default = check_forward(q, k, v, out, lse) + check_backward(dout, q, k, v, *grads)
    shared = (check_forward(q, k, v, out, lse, truth=forward_truth(q, k, v, ns=ONLY))
              + check_backward(dout, q, k, v, *grads,
                               truth=backward_truth(dout, q, k, v, ns=ONLY)))
    assert default == shared and all(c.ok for c in default)


def test_namespace_choice():
    assert truth.namespace() is truth.NUMPY or truth.namespace().on_gpu
    assert truth.namespace("numpy") is truth.NUMPY
    with pytest.raises(ValueError, match="unknown array namespace"):
        truth.namespace("jax")
