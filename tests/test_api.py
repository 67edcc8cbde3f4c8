"""Bad input gets a clear error before any launch; every error names what is wrong."""

import functools
import os
import subprocess
import sys

import numpy as np
import pytest

from numba_flash import cuda_gpu_present, flash_attention_backward, flash_attention_forward
from numba_flash.kernels import (FORWARD, backward, backward_fa2, forward_fa2, forward_rowwise,
                                 forward_tiled)
from numba_flash.testing import Case, check_backward


def qkv(shape_q=(1, 2, 5, 4), shape_k=None, dtype=np.float32):
    shape_k = shape_k or shape_q
    rng = np.random.default_rng(0)
    return (rng.standard_normal(shape_q).astype(dtype), rng.standard_normal(shape_k).astype(dtype),
            rng.standard_normal(shape_k).astype(dtype))


@pytest.mark.parametrize("make,error,match", [
    (lambda: (np.ones(4, np.float32),) + qkv()[1:], ValueError, r"q must have shape \(\.\.\., N, d\)"),
    (lambda: qkv((1, 2, 5, 4), (1, 3, 5, 4)), ValueError, "leading dims differ"),
    (lambda: qkv((2, 5, 4), (3, 5, 4)), ValueError, "leading dims differ"),
    (lambda: qkv((1, 2, 5, 4), (1, 2, 5, 3)), ValueError, "head dims differ"),
    (lambda: qkv((1, 2, 5, 300)), ValueError, "head dim d=300 is not supported"),
    (lambda: qkv((1, 2, 0, 4)), ValueError, "sequence lengths must be at least 1"),
    (lambda: qkv(dtype=np.int32), TypeError, "must be float32 or float64"),
    (lambda: qkv(dtype=np.bool_), TypeError, "must be float32 or float64"),
    (lambda: qkv(dtype=np.complex64), TypeError, "must be float32 or float64"),
    (lambda: qkv(dtype=np.float16), TypeError, "float16 is not supported yet"),
    (lambda: (qkv()[0], qkv()[1].astype(np.float64), qkv()[2]), TypeError, "share one dtype"),
    (lambda: (qkv()[0], qkv()[1], qkv()[2][:, :, :3]), ValueError, "k and v lengths differ"),
])
def test_bad_shapes_and_dtypes(make, error, match):
    with pytest.raises(error, match=match):
        flash_attention_forward(*make())


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), 0.0, -1.0])
def test_bad_scale(scale):
    with pytest.raises(ValueError, match="scale must be finite and positive"):
        flash_attention_forward(*qkv(), scale=scale)


def test_gqa_needs_heads_that_divide():
    with pytest.raises(ValueError, match="Hk divides H"):
        flash_attention_forward(*qkv((1, 4, 5, 4), (1, 3, 5, 4)))


def test_arrays_on_different_devices():
    from numba import cuda
    q, k, v = qkv()
    with pytest.raises(ValueError, match="different devices"):
        flash_attention_forward(q, cuda.to_device(k), v)


def test_unknown_kernel_and_blocks_that_cannot_fit():
    with pytest.raises(ValueError, match="unknown kernel 'nope'; registered"):
        flash_attention_forward(*qkv(), kernel="nope")
    with pytest.raises(ValueError, match="shared memory"):
        forward_tiled.make_forward_kernel(128, 128, 256, False, np.float32)
    with pytest.raises(ValueError, match="shared memory"):
        forward_rowwise.make_forward_kernel(64, 128, 256, False, np.float64)
    with pytest.raises(ValueError, match="shared memory"):
        forward_fa2.make_forward_kernel(128, 128, 128, False, np.float32)
    with pytest.raises(ValueError, match="multiple of"):
        flash_attention_forward(*qkv(), block_m=12, block_n=16, kernel="tiled")
    with pytest.raises(ValueError, match="block_n a multiple of 4"):
        flash_attention_forward(*qkv(), block_m=16, block_n=6, kernel="fa2")
    with pytest.raises(ValueError, match="block_m must be an integer"):
        flash_attention_forward(*qkv(), block_m=0)


def test_backward_checks_out_and_lse():
    q, k, v = qkv()
    out, lse = flash_attention_forward(q, k, v)
    with pytest.raises(ValueError, match=r"lse must have shape \(1, 2, 5\)"):
        flash_attention_backward(out, q, k, v, out, lse[..., :4])
    with pytest.raises(ValueError, match="out must have shape"):
        flash_attention_backward(out, q, k, v, out[..., :3], lse)
    with pytest.raises(TypeError, match="dout must have dtype float32"):
        flash_attention_backward(out.astype(np.float64), q, k, v, out, lse)


def test_default_blocks_fit_every_head_dim():
    for d in (1, 59, 64, 111, 128, 200, 256):
        for dtype in (np.float32, np.float64):
            for module in (forward_tiled, forward_rowwise, forward_fa2):
                bm, bn = module.default_blocks(d, np.dtype(dtype))
                module.make_forward_kernel(bm, bn, d, True, np.dtype(dtype))  # raises if not
            for module in (backward, backward_fa2):
                bm, bn = module.default_blocks(d, np.dtype(dtype))
                module.make_dkdv_kernel(bm, bn, d, True, np.dtype(dtype))
                module.make_dq_kernel(bm, bn, d, True, np.dtype(dtype))
            bm, bn = backward_fa2.default_blocks_atomic(d, np.dtype(dtype))
            backward_fa2.make_dkdv_kernel(bm, bn, d, True, np.dtype(dtype), dq_atomic=True)
            wgmma = FORWARD["wgmma"]                   # wgmma's own tiles or fa2's fallback
            wgmma.make_kernel(*wgmma.default_blocks(d, np.dtype(dtype)), d, True, np.dtype(dtype))


def test_bench_times_every_registered_forward_and_backward_variant():
    from numba_flash import bench
    from numba_flash.kernels import (BACKWARD, DEFAULT_BACKWARD, DEFAULT_FORWARD, FORWARD,
                                     forward_for)
    impls = bench.implementations()
    for name in FORWARD:
        fwd, fwd_bwd, _ = impls[f"numba-flash {name}"]
        assert fwd is not None and (fwd_bwd is not None) == (name == DEFAULT_FORWARD)
    for name in set(BACKWARD) - {DEFAULT_BACKWARD}:     # timed after the forward it follows
        fwd, fwd_bwd, _ = impls[f"numba-flash {forward_for(name)}, backward {name}"]
        assert fwd is None and fwd_bwd is not None
    assert forward_for("wgmma") == "wgmma" and forward_for("fa2") == DEFAULT_FORWARD
    assert "numba-flash wgmma, backward wgmma" in impls


def test_fa2_backward_compiles_once_per_padded_head_dim():
    # every d that pads to the same D_PAD shares one compiled kernel (d read from q at run
    # time); d == D_PAD gets its own, with d a constant
    for make in (backward_fa2.make_dkdv_kernel, backward_fa2.make_dq_kernel):
        assert make(32, 32, 100, True, np.float32)[0] is make(32, 32, 111, True, np.float32)[0]
        assert make(32, 32, 100, True, np.float32)[0] is not make(32, 32, 128, True, np.float32)[0]


def test_fa2_atomic_adds_dq_with_atomics_unless_deterministic():
    # fa2-ffma: fa2-atomic's FFMA products, the same dK and dV sums as fa2's
    q, k, v, dout = Case("atomic", 1, 2, 1, 21, 30, 12, causal=True).inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=True)
    run = functools.partial(flash_attention_backward, dout, q, k, v, out, lse, causal=True,
                            block_m=16, block_n=16)
    fa2, atomic = run(kernel="fa2"), run(kernel="fa2-ffma")
    exact = run(kernel="fa2-atomic", deterministic=True)
    assert all(np.array_equal(a, b) for a, b in zip(exact, fa2))     # the dQ kernel's path
    assert np.array_equal(atomic[1], fa2[1]) and np.array_equal(atomic[2], fa2[2])  # dk, dv
    assert all(c.ok for c in check_backward(dout, q, k, v, *atomic, causal=True))
    assert not np.array_equal(atomic[0], fa2[0])   # dq summed in another order (one launch)
    # the default in float32 puts the accumulating products on tensor cores: other sums
    tensor_cores = run(kernel="fa2-atomic")
    assert all(c.ok for c in check_backward(dout, q, k, v, *tensor_cores, causal=True))
    assert not np.array_equal(tensor_cores[2], fa2[2])


def test_deterministic_runs_the_registered_twin_at_its_own_tiles(monkeypatch):
    # the default backward (fa2-atomic) with deterministic=True is the fa2 backward, tiles and all
    import dataclasses
    from numba_flash.kernels import BACKWARD, DEFAULT_BACKWARD
    twin = BACKWARD[DEFAULT_BACKWARD].when_deterministic
    assert twin and BACKWARD[twin].when_deterministic is None
    calls = []

    def recording(name):
        run = BACKWARD[name].run
        return lambda *a, **kw: calls.append((name, kw["block_m"], kw["block_n"])) or run(*a, **kw)

    for name in (DEFAULT_BACKWARD, twin):
        monkeypatch.setitem(BACKWARD, name, dataclasses.replace(BACKWARD[name], run=recording(name)))
    q, k, v, dout = Case("twin", 1, 1, 1, 9, 11, 8).inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v)
    exact = flash_attention_backward(dout, q, k, v, out, lse, deterministic=True)
    fast = flash_attention_backward(dout, q, k, v, out, lse)
    assert calls == [(twin, *BACKWARD[twin].default_blocks(8, np.float32)),
                     (DEFAULT_BACKWARD, *BACKWARD[DEFAULT_BACKWARD].default_blocks(8, np.float32))]
    assert calls[0][1:] != calls[1][1:]
    assert all(c.ok for g in (exact, fast) for c in check_backward(dout, q, k, v, *g))


@pytest.mark.skipif(cuda_gpu_present(), reason="the case of a machine without a GPU")
@pytest.mark.parametrize("first", ["numba_flash", "numba.cuda"])
def test_without_a_gpu_the_import_order_is_handled(first):
    # numba_flash first: the simulator is turned on. numba.cuda first: too late for that
    # (half-simulator kernels would fail obscurely); a warning says what to do instead.
    code = (f"import os, warnings\nwarnings.simplefilter('always')\nimport {first}\n"
            "import numba_flash\n"
            "print(numba_flash.SIMULATOR, os.environ.get('NUMBA_ENABLE_CUDASIM'))")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    if first == "numba_flash":
        assert run.stdout.split() == ["True", "1"] and "RuntimeWarning" not in run.stderr
    else:
        assert run.stdout.split() == ["False", "None"]
        assert "import numba_flash first" in run.stderr
