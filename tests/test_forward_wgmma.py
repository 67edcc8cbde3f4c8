"""The Hopper forward (kernels/sm90/forward.py), alone and followed by the Hopper backward
(the pair forms S alike): against float64 truth within the tolerance rule on several K/V
blocks (the online softmax's rescaling), on the simulator and on a GPU; P recomputed exactly.
The registry-wide tests (test_kernels, test_properties, verify) cover the rest."""

import numpy as np
import pytest

from numba_flash import flash_attention_backward, flash_attention_forward
from numba_flash.kernels.support import SIMULATOR
from numba_flash.testing import (GPU_CASES, SIMULATOR_CASES, Case, assert_within_tolerance,
                                 check_backward, check_forward)


def check_pair(case, backward=True):
    q, k, v, dout = case.inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel="wgmma")
    assert_within_tolerance(check_forward(q, k, v, out, lse, causal=case.causal),
                            f"wgmma forward {case}")
    if backward:
        grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                         kernel="wgmma")
        assert_within_tolerance(check_backward(dout, q, k, v, *grads, causal=case.causal),
                                f"wgmma backward after the wgmma forward {case}")


# simulator: 2 Q blocks x 3 K/V blocks (m grows across blocks: l and O rescaled), a partial
# last block, causal with Nq > Nk (fully masked rows), large logits; then the bounds of the
# blocks the forwards leave unmasked (every key visible to every row): causal with Nq - Nk = 2
# (a block whose last key only the first row's bound masks is off by one either way), and
# Nk = 127 (a last block with one padding key), lean (d = 9) and wide (d = 68)
@pytest.mark.parametrize("case", [Case("3 K/V blocks, causal, Nq > Nk", 1, 1, 1, 140, 130, 9,
                                       causal=True, logit_scale=8.0),
                                  Case("causal, Nq - Nk = 2", 1, 1, 1, 130, 128, 9, causal=True),
                                  Case("causal, Nq - Nk = 2, wide", 1, 1, 1, 130, 128, 68,
                                       causal=True),
                                  Case("Nk = 127", 1, 1, 1, 70, 127, 9),
                                  Case("Nk = 127, wide", 1, 1, 1, 70, 127, 68)],
                         ids=lambda c: c.name)
def test_wgmma_forward_several_blocks(case):
    check_pair(case, backward=False)


def test_wgmma_pair_several_blocks_gqa():
    check_pair(Case("2 K/V blocks, GQA", 1, 2, 1, 40, 100, 16, logit_scale=30.0))


def test_wide_pair_causal_masked_rows():
    check_pair(Case("d = 128, causal, fully masked rows", 1, 1, 1, 21, 7, 128, causal=True))


@pytest.mark.parametrize("d", [36, 68], ids=["lean, V from a raw block", "wide, raw blocks"])
def test_forward_staged_from_raw_blocks_gives_the_twins_bits(d):
    """The forward's vector kernels bring K/V tiles a block ahead by cp.async into raw blocks
    in shared memory and split them into the tiles from there (the lean kernel, d <= 64: V;
    the wide one: K and V); their twins stage them from global memory. Same tiles, so the same
    out and lse bit for bit: Nq = Nk = 130, causal (the wide kernel runs its two query blocks
    heaviest first; in the first, warpgroup 0 only stages the K/V block past its rows), the
    last K/V block partial (zeros past Nk from the copies' zero fill), d = 36 (lean) or 68
    (wide: 4 columns in the upper half), zeros past d."""
    from numba_flash.kernels.sm90 import forward
    from numba_flash.kernels.support import head_grid
    from numba_flash.kernels.vector_io import aligned
    case = Case("raw blocks", 1, 1, 1, 130, 130, d, causal=True, logit_scale=4.0)
    q, k, v, _ = case.inputs(np.float32)
    q3, k3, v3 = (x.reshape(-1, x.shape[2], case.d) for x in (q, k, v))
    assert aligned(q3, k3, v3)
    dispatch, threads = (forward.lean_launcher if d <= 64 else forward.launcher)(True)
    block_m = forward.tiles(d)[0]
    results = []
    for kernel in (dispatch.vector, dispatch.scalar):
        out, lse = np.zeros_like(q3), np.zeros(q3.shape[:2], np.float32)
        kernel[(-(-130 // block_m), *head_grid(1)), threads](q3, k3, v3, out, lse,
                                                              np.float32(case.d ** -0.5), 1, 1)
        results.append((out, lse))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    assert_within_tolerance(check_forward(q, k, v, results[0][0].reshape(q.shape),
                                          results[0][1].reshape(q.shape[:-1]), causal=True),
                            f"forward from raw blocks, d = {d}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", [c for c in GPU_CASES if 64 < c.d <= 128]
                         + [Case("d = 128, N = 2048", 1, 4, 4, 2048, 2048, 128),
                            Case("d = 128, N = 2048, causal, GQA", 1, 4, 2, 2048, 2048, 128,
                                 causal=True),
                            Case("d = 96, odd, causal, GQA", 2, 3, 1, 197, 131, 96,
                                 causal=True),
                            Case("d = 80, N = 1000, logits x30", 1, 2, 2, 1000, 1000, 80,
                                 logit_scale=30.0)],
                         ids=lambda c: c.name)
def test_gpu_wide_pair_within_tolerance(case):
    check_pair(case)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [c for c in GPU_CASES if c.d <= 64]
                         + [Case("N = 2048", 1, 4, 4, 2048, 2048, 64),
                            Case("N = 2048, causal, GQA", 1, 4, 2, 2048, 2048, 64, causal=True),
                            Case("N = 1000, logits x30", 1, 2, 2, 1000, 1000, 48,
                                 logit_scale=30.0)],
                         ids=lambda c: c.name)
def test_gpu_wgmma_pair_within_tolerance(case):
    check_pair(case)


def recomputed_dv_error(forward, case, deterministic=False):
    """(dv comparison) of the wgmma backward after `forward` on `case`."""
    q, k, v, dout = case.inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel=forward)
    grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal, kernel="wgmma",
                                     deterministic=deterministic)
    return check_backward(dout, q, k, v, *grads, causal=case.causal)


LOGITS_1E3 = [next(c for c in (SIMULATOR_CASES if SIMULATOR else GPU_CASES)
                   if c.name == "logits x1e3"),
              # the wide pair (64 < d <= 128)
              Case("d = 100, logits x1e3", 1, 1, 1, 17, 17, 100, logit_scale=1e3) if SIMULATOR
              else Case("d = 128, logits x1e3", 1, 2, 2, 256, 256, 128, logit_scale=1e3)]


@pytest.mark.parametrize("case", LOGITS_1E3, ids=lambda c: c.name)
def test_wgmma_backward_recomputes_p_exactly_after_the_wgmma_forward(case, deterministic=False):
    """At logits x1e3 (|S| ~ 1e6, an ulp of 0.06) P is recomputed exactly only if the backward
    forms S bit for bit as the forward did; after the fa2 forward (S by FFMA) it is not. On the
    H200 for GPU_CASES' case (2026-11-30 / 12-01): the lean backward's dv erred 5.6 after fa2's
    forward and 8.3e-07 after the wgmma forward (fa2-atomic after fa2: 8.3e-07), allowance 193.
    On the simulator the products are the NumPy model in both passes, so the same holds there.
    (With deterministic=True the same dK/dV kernel runs without its dQ: its dk and dv are the
    atomic path's bit for bit, test_backward_wgmma.py.)"""
    # dv: the dK/dV kernel's (deterministic: run without its dQ). dq is no witness here: at
    # these logits P is nearly one-hot and dS nearly 0, so dq errs ~1e-3 after either forward
    paired = recomputed_dv_error("wgmma", case, deterministic)[2]
    assert paired.max_err < 1e-4 * paired.allowed, paired
    unpaired = recomputed_dv_error("fa2", case, deterministic)[2]   # S formed another way
    assert unpaired.max_err > 1e3 * paired.max_err, (unpaired, paired)
