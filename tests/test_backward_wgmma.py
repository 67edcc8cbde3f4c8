"""kernels/backward_wgmma.py (its lean kernel with paired steps is the registered "wgmma"
backward), its default and its options (steps from zero, prefetch with unpaired products, the
lean two-blocks-per-SM kernel, lean with paired steps), each registered here for the test:
against float64 truth within the tolerance rule, on the simulator (its products modelled by
wgmma.py) and on a GPU; clear errors for what it does not cover."""

import functools

import numpy as np
import pytest

from numba_flash import flash_attention_backward, flash_attention_forward
from numba_flash.kernels import (BACKWARD, backward_wgmma, backward_wgmma_wide,
                                 register_backward)
from numba_flash.testing import GPU_CASES, Case, assert_within_tolerance, check_backward

NAME = "wgmma (test)"


@pytest.fixture
def wgmma_registered(request):
    """The wgmma backward (with the options the test's `options` parameter gives, if any) in
    the registry for one test (the API is the way to run it)."""
    options = getattr(request, "param", {})
    register_backward(NAME, functools.partial(backward_wgmma.run_backward, **options),
                      backward_wgmma.default_blocks)
    yield NAME
    del BACKWARD[NAME]


def check_case(case, kernel):
    q, k, v, dout = case.inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=case.causal)
    grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal, kernel=kernel)
    assert_within_tolerance(check_backward(dout, q, k, v, *grads, causal=case.causal),
                            f"wgmma backward {case}")


# simulator: one 64-row K/V block, partial; GQA with two query heads and two Q blocks; causal
# with a fully masked row; logits x1e3
SMALL = (Case("GQA, two Q blocks, Nq != Nk", 1, 2, 1, 70, 45, 12),
         Case("causal, fully masked rows", 1, 1, 1, 21, 7, 5, causal=True),
         Case("logits x1e3", 1, 1, 1, 17, 17, 8, logit_scale=1e3))


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.name)
def test_wgmma_backward_within_tolerance(case, wgmma_registered):
    check_case(case, wgmma_registered)


# two Q blocks of one head, so that the prefetch runs
TWO_BLOCKS = Case("two Q blocks, causal", 1, 1, 1, 70, 9, 4, causal=True)


@pytest.mark.parametrize("wgmma_registered", [dict(chained=False),
                                              dict(prefetch=True, paired=False),
                                              dict(lean=True),
                                              dict(lean=True, paired_steps=True)],
                         indirect=True, ids=["steps", "prefetch, unpaired", "lean",
                                             "lean, paired steps"])
def test_wgmma_backward_options_within_tolerance(wgmma_registered):
    check_case(TWO_BLOCKS, wgmma_registered)


def test_wgmma_backward_rejects_what_it_does_not_cover():
    with pytest.raises(ValueError, match="float32 only"):
        backward_wgmma.check(64, np.float64)
    with pytest.raises(ValueError, match="head_dim <= 64"):
        backward_wgmma.check(65, np.float32)
    with pytest.raises(ValueError, match="64 x 64 tiles"):
        backward_wgmma.check(64, np.float32, 32, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [c for c in GPU_CASES if c.d <= 64]
                         + [Case("N = 2048", 1, 4, 4, 2048, 2048, 64),
                            Case("N = 2048, causal, GQA", 1, 4, 2, 2048, 2048, 64, causal=True)],
                         ids=lambda c: c.name)
@pytest.mark.parametrize("wgmma_registered", [{}, dict(chained=False),
                                              dict(prefetch=True, paired=False),
                                              dict(lean=True),
                                              dict(lean=True, paired_steps=True)],
                         indirect=True, ids=["default", "steps", "prefetch, unpaired", "lean",
                                             "lean, paired steps"])
def test_gpu_wgmma_backward_within_tolerance(case, wgmma_registered):
    check_case(case, wgmma_registered)


# the registered "wgmma" backward at 64 < d <= 128: backward_wgmma_wide's two warpgroups
# after the fa2 forward. Simulator: GQA with two query heads, two Q blocks and a partial K/V
# block at d = 72 (test_forward_wgmma has d = 128, causal with fully masked rows, after the
# wide wgmma forward)
WIDE_SMALL = (Case("d = 72, GQA, two Q blocks, Nq != Nk", 1, 2, 1, 70, 45, 72),)


@pytest.mark.parametrize("case", WIDE_SMALL, ids=lambda c: c.name)
def test_wide_backward_within_tolerance(case):
    check_case(case, "wgmma")


def test_wide_backward_applies_where_lean_does_not():
    assert backward_wgmma_wide.applies(65, np.float32)
    assert backward_wgmma_wide.applies(128, np.float32)
    assert not backward_wgmma_wide.applies(64, np.float32)
    assert not backward_wgmma_wide.applies(129, np.float32)
    assert not backward_wgmma_wide.applies(128, np.float64)
    assert not backward_wgmma_wide.applies(128, np.float32, 32, 64)
    with pytest.raises(ValueError, match="head_dim <= 128"):
        backward_wgmma_wide.check(129, np.float32)
    with pytest.raises(ValueError, match="float32 only"):
        backward_wgmma_wide.check(128, np.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [c for c in GPU_CASES if 64 < c.d <= 128]
                         + [Case("d = 128, N = 2048", 1, 4, 4, 2048, 2048, 128),
                            Case("d = 128, N = 2048, causal, GQA", 1, 4, 2, 2048, 2048, 128,
                                 causal=True),
                            Case("d = 128, logits x1e3", 1, 2, 2, 256, 256, 128,
                                 logit_scale=1e3),
                            Case("d = 96, odd, causal", 2, 3, 1, 197, 131, 96, causal=True)],
                         ids=lambda c: c.name)
def test_gpu_wide_backward_within_tolerance(case):
    check_case(case, "wgmma")


def run_wide_pair(case, forward_options, backward_options):
    """out, lse, dq, dk, dv of the wide forward and backward with these options, registered
    for the call under one name (the API is the way to run them)."""
    from numba_flash.kernels import FORWARD, forward_wgmma, forward_wgmma_wide, register_forward
    name = "wide pair (test)"
    register_forward(name, lambda bm, bn, d, causal, dtype: forward_wgmma_wide.launcher(
        bool(causal), **forward_options), forward_wgmma.default_blocks_or_fallback)
    register_backward(name, functools.partial(backward_wgmma_wide.run_backward,
                                              **backward_options),
                      lambda head_dim, dtype: (64, 64), forward=name)
    try:
        q, k, v, dout = case.inputs(np.float32)
        out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel=name)
        return [out, lse, *flash_attention_backward(dout, q, k, v, out, lse,
                                                    causal=case.causal, kernel=name)]
    finally:
        del FORWARD[name], BACKWARD[name]


@pytest.mark.parametrize("case", [Case("d = 128, causal", 1, 1, 1, 70, 65, 128, causal=True),
                                  Case("d = 111", 1, 1, 1, 70, 40, 111)], ids=lambda c: c.name)
def test_wide_pair_s_permuted_is_the_unpermuted_bit_for_bit_on_the_simulator(case):
    """s_permuted reorders S and dP's contraction within each chained product (K and V staged
    alike, dQ^T's rows read where they went). The simulator's chained product rounds an exact
    sum once, so there the order changes nothing: any difference is a fragment against the
    wrong B entries or dQ written to the wrong columns. d = 128 runs the 16-byte loads and
    vector atomics, d = 111 the scalar variant (AlignedDispatch)."""
    from numba_flash.kernels.common import SIMULATOR
    if not SIMULATOR:
        pytest.skip("on a GPU the tensor core's chained sums depend on the order")
    chained = dict(pv_chained=True, s_chained=True)
    backward = dict(backward_wgmma_wide.REGISTERED, s_permuted=False, vector_loads=False)
    plain = run_wide_pair(case, chained, backward)
    permuted = run_wide_pair(case, dict(chained, s_permuted=True, vector_loads=True),
                             dict(backward, s_permuted=True, vector_loads=True))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), plain, permuted):
        assert np.array_equal(a, b), name
