"""Every registered kernel against truth on named cases (random problems: test_properties)."""

import numpy as np
import pytest

from numba_flash import flash_attention_backward, flash_attention_forward
from numba_flash.registry import PAIRS, resolve
from numba_flash.testing import (SIMULATOR_CASES, Case, assert_within_tolerance,
                                 check_backward, check_forward)


def run_case(case, dtype, forward, backward=None, **blocks):
    q, k, v, dout = case.inputs(dtype)
    out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel=forward, **blocks)
    assert out.shape == q.shape and lse.shape == q.shape[:-1]
    assert out.dtype == dtype and lse.dtype == dtype
    assert_within_tolerance(check_forward(q, k, v, out, lse, causal=case.causal), f"{forward} {case}")
    if backward:
        grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                         kernel=backward, **blocks)
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
        assert_within_tolerance(check_backward(dout, q, k, v, *grads, causal=case.causal),
                                f"backward {backward} {case}")


def hands_over(kernel, dtype, d=8):
    """Whether the pair gives `dtype` to another pair here (a half pair given float32 runs its
    fallback's kernels): that pair's own cases test those kernels, one case the hand-over."""
    return resolve(kernel, d, dtype).name != kernel


def pair_cases(cases, dtype):
    """(case, kernel) for every registered pair: every case where it runs dtype itself, the
    first where it hands dtype over (the rest would run the same kernels again)."""
    return [pytest.param(c, k, id=f"{k}-{c.name}") for k in sorted(PAIRS) for c in cases
            if c is cases[0] or not hands_over(k, dtype)]


@pytest.mark.parametrize("case,kernel", pair_cases(SIMULATOR_CASES, np.float32))
def test_pair_float32(case, kernel):
    run_case(case, np.float32, kernel, kernel)


@pytest.mark.parametrize("case,kernel", pair_cases(SIMULATOR_CASES[:3], np.float32))
def test_deterministic_backward_float32(case, kernel):
    q, k, v, dout = case.inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel=kernel)
    grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                     kernel=kernel, deterministic=True)
    assert_within_tolerance(check_backward(dout, q, k, v, *grads, causal=case.causal),
                            f"deterministic backward {kernel} {case}")


@pytest.mark.parametrize("case", [c for c in SIMULATOR_CASES
                                  if c.name in ("GQA", "logits x1e3", "fully masked rows")],
                         ids=lambda c: c.name)
def test_float64(case):
    for kernel in sorted(PAIRS):
        if case.name == "GQA" or not hands_over(kernel, np.float64):
            run_case(case, np.float64, kernel, kernel)


def test_float64_kernels_match_finite_differences():
    case = Case("fd", 1, 2, 1, 6, 9, 3, causal=True)
    q, k, v, w = case.inputs(np.float64, 3)
    loss = lambda q, k, v: float((flash_attention_forward(q, k, v, causal=True)[0] * w).sum())
    out, lse = flash_attention_forward(q, k, v, causal=True)
    grads = flash_attention_backward(w, q, k, v, out, lse, causal=True)
    eps = 1e-6
    for x, g in zip((q, k, v), grads):
        for idx in [(0, x.shape[1] - 1, x.shape[2] - 1, 2), (0, 0, 4, 1)]:
            old = x[idx]
            x[idx] = old + eps
            up = loss(q, k, v)
            x[idx] = old - eps
            down = loss(q, k, v)
            x[idx] = old
            assert abs(g[idx] - (up - down) / (2 * eps)) < 1e-7, (idx, g[idx])


def test_fully_masked_rows_give_zero_and_neg_inf():
    q, k, v, dout = Case("masked", 1, 1, 1, 12, 4, 5, causal=True).inputs(np.float32)
    for kernel in sorted(PAIRS):
        out, lse = flash_attention_forward(q, k, v, causal=True, kernel=kernel)
        assert np.all(out[..., :8, :] == 0) and np.all(np.isneginf(lse[..., :8]))
        assert np.isfinite(lse[..., 8:]).all()
    grads = flash_attention_backward(dout, q, k, v, out, lse, causal=True)
    assert all(np.isfinite(g).all() for g in grads)
    assert np.all(grads[0][..., :8, :] == 0)


def test_inputs_are_not_modified_and_device_arrays_round_trip():
    from numba import cuda
    q, k, v, dout = Case("io", 1, 2, 2, 9, 11, 4).inputs(np.float32)
    copies = [x.copy() for x in (q, k, v, dout)]
    out, lse = flash_attention_forward(q, k, v)
    grads = flash_attention_backward(dout, q, k, v, out, lse)
    for x, c in zip((q, k, v, dout), copies):
        np.testing.assert_array_equal(x, c)
    d_out, d_lse = flash_attention_forward(*(cuda.to_device(x) for x in (q, k, v)))
    assert not isinstance(d_out, np.ndarray) and hasattr(d_out, "copy_to_host")
    np.testing.assert_array_equal(d_out.copy_to_host(), out)
    d_grads = flash_attention_backward(*(cuda.to_device(x) for x in (dout, q, k, v)), d_out, d_lse)
    for g, dg in zip(grads, d_grads):
        np.testing.assert_array_equal(dg.copy_to_host(), g)


def test_tile_size_does_not_change_the_answer():
    q, k, v, dout = Case("tiles", 1, 1, 1, 37, 29, 12, causal=True).inputs(np.float64)
    results = [flash_attention_forward(q, k, v, causal=True, block_m=bm, block_n=bn)
               for bm, bn in ((8, 16), (16, 16), (32, 64))]
    for out, lse in results[1:]:
        np.testing.assert_allclose(out, results[0][0], rtol=0, atol=1e-14)
        np.testing.assert_allclose(lse, results[0][1], rtol=0, atol=1e-14)


# --- real sizes, on the GPU ----------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_backward_is_deterministic():
    q, k, v, dout = Case("det", 2, 4, 2, 300, 333, 64, causal=True).inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=True)
    first = flash_attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    for _ in range(19):
        again = flash_attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
        for a, b in zip(first, again):
            assert np.array_equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_gpu_array_kinds_stay_on_device(lib):
    mod = pytest.importorskip(lib)
    q, k, v, dout = Case("kinds", 1, 2, 1, 65, 70, 32, causal=True).inputs(np.float32)
    host_out, host_lse = flash_attention_forward(q, k, v, causal=True)
    host_grads = flash_attention_backward(dout, q, k, v, host_out, host_lse, causal=True)
    dev = [mod.asarray(x) if lib == "cupy" else mod.from_numpy(x).cuda() for x in (q, k, v, dout)]
    out, lse = flash_attention_forward(*dev[:3], causal=True)
    grads = flash_attention_backward(dev[3], *dev[:3], out, lse, causal=True)
    to_host = (lambda x: x.get()) if lib == "cupy" else (lambda x: x.cpu().numpy())
    assert type(out) is type(dev[0]) and all(type(g) is type(dev[0]) for g in grads)
    np.testing.assert_array_equal(to_host(out), host_out)
    for g, h in zip(grads, host_grads):
        np.testing.assert_array_equal(to_host(g), h)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_wgmma_pair_on_torch_tensors(d):
    """The wgmma pair on torch tensors, whose outputs and workspace come from torch's pool and
    whose inputs are imported without a host sync (arrays.py), within tolerance."""
    torch = pytest.importorskip("torch")
    case = Case("torch", 2, 4, 2, 300, 333, d, causal=True)
    q, k, v, dout = case.inputs(np.float32)
    dev = [torch.from_numpy(x).cuda() for x in (q, k, v, dout)]
    out, lse = flash_attention_forward(*dev[:3], causal=True, kernel="wgmma")
    grads = flash_attention_backward(dev[3], *dev[:3], out, lse, causal=True, kernel="wgmma")
    assert all(isinstance(x, torch.Tensor) for x in (out, lse, *grads))
    out, lse, *grads = (x.cpu().numpy() for x in (out, lse, *grads))
    assert_within_tolerance(check_forward(q, k, v, out, lse, causal=True) +
                            check_backward(dout, q, k, v, *grads, causal=True), "wgmma, torch")


def test_inputs_are_imported_without_sync_only_from_the_legacy_stream():
    """arrays._must_sync: no host sync for stream 1 (the legacy default stream our kernels run
    on), a sync for any other stream the producer names."""
    from numba_flash.arrays import _must_sync
    assert not _must_sync(1) and not _must_sync(None)
    assert _must_sync(2) and _must_sync(0x7F00)
    assert not _must_sync(0x7F00, 0x7F00)           # the stream our kernels run on


@pytest.mark.parametrize("d, dtype, nq", [(1, np.float32, 5), (59, np.float32, 70),
                                          (128, np.float32, 33), (256, np.float64, 9)])
def test_preprocess_gives_rowsum_and_clears_dq(d, dtype, nq):
    """D = rowsum(dO * O) row by row (blocks of preprocess_rows rows, the last one partial),
    dq zeroed with clear=True and untouched without."""
    from numba import cuda

    from numba_flash.kernels.backward import preprocess_rows, run_preprocess
    assert nq % preprocess_rows(d, dtype) != 0 or nq < preprocess_rows(d, dtype)
    rng = np.random.default_rng(d)
    dout, out = (rng.standard_normal((2, nq, d)).astype(dtype) for _ in range(2))
    truth = (dout.astype(np.float64) * out).sum(axis=-1)
    for clear in (False, True):
        D = cuda.to_device(np.full((2, nq), np.nan, dtype))
        dq = cuda.to_device(np.ones((2, nq, d), dtype))
        run_preprocess(cuda.to_device(dout), cuda.to_device(out), D, dq, clear=clear)
        bound = d * np.finfo(dtype).eps * (np.abs(dout) * np.abs(out)).sum(axis=-1)
        assert np.all(np.abs(D.copy_to_host() - truth) <= bound)
        assert np.all(dq.copy_to_host() == (0 if clear else 1))
