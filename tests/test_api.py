"""Bad input gets a clear error before any launch; every error names what is wrong."""

import functools
import os
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from numba_flash import cuda_gpu_present, flash_attention_backward, flash_attention_forward
from numba_flash import registry
from numba_flash.kernels import (backward, backward_fa2, forward_fa2, forward_rowwise,
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
    (lambda: qkv(dtype=np.int32), TypeError, "must be one of float16, bfloat16, float32, float64"),
    (lambda: qkv(dtype=np.bool_), TypeError, "must be one of float16"),
    (lambda: qkv(dtype=np.complex64), TypeError, "must be one of float16"),
    (lambda: qkv(dtype=np.longdouble), TypeError, "must be one of float16"),
    (lambda: qkv(dtype=ml_dtypes.float8_e4m3fn), TypeError, "must be one of float16"),
    (lambda: (qkv()[0].astype(np.float16), qkv()[1].astype(ml_dtypes.bfloat16),
              qkv()[2].astype(np.float16)), TypeError, "share one dtype"),
    (lambda: (qkv()[0], qkv()[1].astype(np.float64), qkv()[2]), TypeError, "share one dtype"),
    (lambda: qkv(dtype=">f4"), TypeError, "native byte order, got >f4"),
    (lambda: qkv(dtype=">f2"), TypeError, "native byte order, got >f2"),
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
        flash_attention_forward(*qkv(), block_m=0, kernel="fa2")


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
            for name in registry.PAIRS:               # what the API asks each pair for
                pair = registry.resolve(name, d, dtype, "sm_90")
                pair.make_forward(*pair.forward_tiles(d, np.dtype(dtype)), d, True,
                                  np.dtype(dtype))
                for det in (False, True):
                    assert pair.accepts("backward", *pair.backward_tiles(d, np.dtype(dtype), det),
                                        d, dtype, det)


def test_bench_times_every_registered_pair_and_the_default():
    from numba_flash import bench
    impls = bench.implementations()
    for name in ("auto", *registry.PAIRS):
        fwd, fwd_bwd, _ = impls[f"numba-flash {name}"]
        assert fwd is not None and fwd_bwd is not None


def test_auto_picks_the_fastest_pair_that_can_run():
    for device, d, dtype, name in (("sm_90", 64, np.float32, "wgmma"),
                                   ("sm_90", 128, np.float32, "wgmma"),
                                   ("sm_90", 129, np.float32, "fa2"),
                                   ("sm_90", 64, np.float64, "fa2"),
                                   ("sm_90", 64, "bfloat16", "wgmma16"),
                                   ("sm_90", 65, "bfloat16", "wgmma16"),
                                   ("sm_90", 128, "float16", "wgmma16"),
                                   ("sm_90", 129, "float16", "fa2"),
                                   ("simulator", 64, "bfloat16", "fa2"),
                                   ("sm_80", 64, np.float32, "fa2"),
                                   # other GPUs: the 16-bit kernels on mma.sync where their
                                   # shared memory fits (d = 128: 145 KiB; sm_86 has 99)
                                   ("sm_80", 128, "bfloat16", "mma16"),
                                   ("sm_86", 64, "float16", "mma16"),
                                   ("sm_86", 128, "bfloat16", "fa2"),
                                   ("sm_89", 100, "float16", "fa2"),
                                   ("sm_75", 64, "float16", "fa2"),
                                   ("simulator", 64, np.float32, "fa2")):
        assert registry.resolve("auto", d, dtype, device).name == name, (device, d, dtype)
    with pytest.raises(TypeError, match="kernel must be a registered name"):
        registry.resolve(["fa2"], 64, np.float32)


@pytest.mark.parametrize("flag", ["causal", "deterministic"])
@pytest.mark.parametrize("value", ["no", 2, None, 1.0])
def test_flags_must_be_booleans(flag, value):
    q, k, v = qkv()
    call = (flash_attention_forward if flag == "causal" else
            lambda q, k, v, **kw: flash_attention_backward(q, q, k, v, q, q[..., 0], **kw))
    with pytest.raises(TypeError, match=f"{flag} must be True or False"):
        call(q, k, v, **{flag: value})


def test_numpy_bools_are_bools():
    q, k, v = qkv((1, 1, 3, 2))
    out, lse = flash_attention_forward(q, k, v, causal=np.bool_(True))
    assert np.array_equal(out, flash_attention_forward(q, k, v, causal=True)[0])


def test_fa2_backward_compiles_once_per_padded_head_dim():
    # every d that pads to the same D_PAD shares one compiled kernel (d read from q at run
    # time); d == D_PAD gets its own, with d a constant
    for make in (backward_fa2.make_dkdv_kernel, backward_fa2.make_dq_kernel):
        assert make(32, 32, 100, True, np.float32)[0] is make(32, 32, 111, True, np.float32)[0]
        assert make(32, 32, 100, True, np.float32)[0] is not make(32, 32, 128, True, np.float32)[0]


def test_fa2_adds_dq_with_atomics_unless_deterministic():
    # with FFMA products (tensor_cores=False) the atomic path's dK and dV are the dQ-kernel
    # path's sums exactly; dq is summed in another order
    q, k, v, dout = Case("atomic", 1, 2, 1, 21, 30, 12, causal=True).inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=True, kernel="fa2")

    def ffma(*args, deterministic, **kw):
        backward_fa2.run_backward(*args, dq_atomic=not deterministic, tensor_cores=False, **kw)
    registry.register(registry.variant("fa2 ffma (test)", "fa2", run_backward=ffma))
    try:
        run = functools.partial(flash_attention_backward, dout, q, k, v, out, lse, causal=True,
                                block_m=16, block_n=16)
        exact, atomic = run(kernel="fa2", deterministic=True), run(kernel="fa2 ffma (test)")
    finally:
        registry.unregister("fa2 ffma (test)")
    assert np.array_equal(atomic[1], exact[1]) and np.array_equal(atomic[2], exact[2])  # dk, dv
    assert all(c.ok for c in check_backward(dout, q, k, v, *atomic, causal=True))
    assert not np.array_equal(atomic[0], exact[0])   # dq summed in another order (one launch)
    # the default in float32 puts the accumulating products on tensor cores: other sums
    tensor_cores = run(kernel="fa2")
    assert all(c.ok for c in check_backward(dout, q, k, v, *tensor_cores, causal=True))
    assert not np.array_equal(tensor_cores[2], exact[2])


def test_deterministic_fa2_runs_its_dq_kernel_at_its_own_tiles(monkeypatch):
    calls = []
    real = backward_fa2.run_backward
    monkeypatch.setattr(backward_fa2, "run_backward", lambda *a, **kw: calls.append(
        (kw["dq_atomic"], kw["block_m"], kw["block_n"])) or real(*a, **kw))
    q, k, v, dout = Case("twin", 1, 1, 1, 9, 11, 8).inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, kernel="fa2")
    exact = flash_attention_backward(dout, q, k, v, out, lse, deterministic=True, kernel="fa2")
    fast = flash_attention_backward(dout, q, k, v, out, lse, kernel="fa2")
    assert calls == [(False, *backward_fa2.default_blocks(8, np.float32)),
                     (True, *backward_fa2.default_blocks_atomic(8, np.float32))]
    assert calls[0][1:] != calls[1][1:]
    assert all(c.ok for g in (exact, fast) for c in check_backward(dout, q, k, v, *g))


@pytest.mark.skipif(cuda_gpu_present(), reason="the case of a machine without a GPU")
@pytest.mark.parametrize("template", ["forward_rowwise.py", "forward_tiled.py"])
def test_a_copied_kernel_template_imported_first_turns_the_simulator_on(template, tmp_path):
    # README, "Changing a kernel": a copy of a template, imported before numba_flash itself
    import numba_flash
    shutil.copy(os.path.join(os.path.dirname(numba_flash.__file__), "kernels", template),
                tmp_path / "my_kernel.py")
    code = ("import sys, warnings\nwarnings.simplefilter('always')\n"
            f"sys.path.insert(0, {str(tmp_path)!r})\nimport my_kernel\nimport numba_flash\n"
            "print(numba_flash.SIMULATOR)")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True"] and "imported before numba_flash" not in run.stderr


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


# --- the calls' memo (api._memo_key, _recall, _remember) -------------------------------------

class _Recorder:
    """A forward that launches nothing and notes its pair's name: launcher[grid, threads,
    stream](*args)."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __getitem__(self, config):
        return lambda *args: self.calls.append(self.name)


def _recording_variant(name, calls, label=None):
    return registry.variant(name, "tiled", make_forward=lambda bm, bn, d, causal, dtype: (
        _Recorder(label or name, calls), 32))


def test_a_repeated_call_is_checked_once_and_a_changed_one_again(monkeypatch):
    from numba_flash import api
    checked = []
    real = api._validate
    monkeypatch.setattr(api, "_validate", lambda *a: checked.append(1) or real(*a))
    q, k, v = qkv((1, 2, 7, 4))
    first = flash_attention_forward(q, k, v, kernel="tiled")
    again = flash_attention_forward(q, k, v, kernel="tiled")
    assert len(checked) == 1
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    # anything the checks read, changed, is checked again
    flash_attention_forward(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                            kernel="tiled")
    flash_attention_forward(*qkv((1, 2, 8, 4)), kernel="tiled")
    flash_attention_forward(q, k, v, kernel="tiled", causal=True)
    flash_attention_forward(q, k, v, kernel="tiled", scale=0.5)
    flash_attention_forward(q, k, v, kernel="tiled", scale=np.float32(0.5))
    flash_attention_forward(q, k, v, kernel="tiled", block_m=16)
    assert len(checked) == 7
    # the backward: once for one call, again when lse changes
    dout = q.copy()
    out, lse = first
    g1 = flash_attention_backward(dout, q, k, v, out, lse, kernel="tiled")
    g2 = flash_attention_backward(dout, q, k, v, out, lse, kernel="tiled")
    assert len(checked) == 8
    assert all(np.array_equal(a, b) for a, b in zip(g1, g2))
    with pytest.raises(TypeError, match="lse must have dtype float32"):
        flash_attention_backward(dout, q, k, v, out, lse.astype(np.float64), kernel="tiled")


def test_the_memo_keeps_no_failed_call():
    from numba_flash import api
    q, k, v = qkv((1, 2, 7, 4))
    flash_attention_forward(q, k, v, kernel="tiled")
    # what passed with native v fails with the same values in big-endian order, every time
    for _ in range(2):
        with pytest.raises(TypeError, match="native byte order"):
            flash_attention_forward(q, k, v.astype(">f4"), kernel="tiled")
        with pytest.raises(ValueError):                 # tiles the factory refuses
            flash_attention_forward(q, k, v, kernel="tiled", block_m=512)
    # an unhashable option is checked at every call, not refused by the memo
    out, _ = flash_attention_forward(q, k, v, kernel="tiled", scale=np.array(0.5))
    assert np.allclose(out, flash_attention_forward(q, k, v, kernel="tiled", scale=0.5)[0])
    assert api._memo_key((q, k, v), ([],)) is None
    assert api._memo_key((q, k, list(v)), ()) is None      # an array-like: not keyed


def test_a_scale_that_can_change_in_place_is_checked_every_call():
    # a 0-d tensor is hashed by its identity: remembered, a scale changed in place would be
    # used stale and never checked again
    torch = pytest.importorskip("torch")
    from numba_flash import api
    q, k, v = qkv((1, 2, 7, 4))
    scale = torch.tensor(0.5)
    first, _ = flash_attention_forward(q, k, v, kernel="tiled", scale=scale)
    assert api._memo_key((q, k, v), ("forward", type(scale), scale)) is None
    scale.fill_(2.0)
    out, _ = flash_attention_forward(q, k, v, kernel="tiled", scale=scale)
    assert np.array_equal(out, flash_attention_forward(q, k, v, kernel="tiled", scale=2.0)[0])
    assert not np.array_equal(out, first)
    scale.fill_(-1.0)
    with pytest.raises(ValueError, match="finite and positive"):
        flash_attention_forward(q, k, v, kernel="tiled", scale=scale)


def test_a_remembered_name_runs_what_is_registered_now():
    calls = []
    q, k, v = qkv((1, 1, 6, 4))
    registry.register(_recording_variant("memo (test)", calls, "first"))
    try:
        flash_attention_forward(q, k, v, kernel="memo (test)")
        registry.register(_recording_variant("memo (test)", calls, "second"))
        flash_attention_forward(q, k, v, kernel="memo (test)")
        # the resolved pair replaced by hand in PAIRS (not through register) is noticed too
        registry.PAIRS["memo (test)"] = _recording_variant("memo (test)", calls, "third")
        flash_attention_forward(q, k, v, kernel="memo (test)")
    finally:
        registry.unregister("memo (test)")
    assert calls == ["first", "second", "third"]
    with pytest.raises(ValueError, match="unknown kernel 'memo \\(test\\)'"):
        flash_attention_forward(q, k, v, kernel="memo (test)")
    # a name that fell back: registering what it names anew ends the fallback
    calls.clear()
    registry.register(_recording_variant("memo fallback (test)", calls))
    registry.register(registry.variant("memo (test)", "memo fallback (test)",
                                       can_run=lambda d, dtype, device: False,
                                       fallback="memo fallback (test)"))
    try:
        flash_attention_forward(q, k, v, kernel="memo (test)")
        registry.register(_recording_variant("memo (test)", calls))
        flash_attention_forward(q, k, v, kernel="memo (test)")
    finally:
        registry.unregister("memo (test)")
        registry.unregister("memo fallback (test)")
    assert calls == ["memo fallback (test)", "memo (test)"]


def test_torch_tensors_are_keyed_by_all_the_checks_read():
    torch = pytest.importorskip("torch")
    from numba_flash import api
    x = torch.zeros(2, 3, 8, 4)
    same = api._array_key(torch.ones(2, 3, 8, 4))
    assert api._array_key(x) == same and hash(api._array_key(x)) == hash(same)
    others = [torch.zeros(2, 3, 8, 4, dtype=torch.bfloat16),
              torch.zeros(2, 3, 4, 8).transpose(2, 3),        # the same shape, not contiguous
              torch.zeros(2, 3, 8, 5),
              torch.nn.Parameter(torch.zeros(2, 3, 8, 4)),
              torch._neg_view(torch.zeros(2, 3, 8, 4))]       # a lazy negation
    assert len({api._array_key(t) for t in others} | {same}) == len(others) + 1
    # a CPU tensor's key says so (the checks refuse it: torch tensors run on CUDA devices)
    assert api._array_key(x)[3:5] == (False, -1)
    with pytest.raises(ValueError, match="must be on a CUDA device"):
        flash_attention_forward(x, x, x)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["torch", "cupy"])
def test_gpu_device_arrays_are_checked_once_a_key(monkeypatch, kind):
    from numba_flash import api
    lib = pytest.importorskip(kind)
    checked = []
    real = api._validate
    monkeypatch.setattr(api, "_validate", lambda *a: checked.append(1) or real(*a))

    def device(x):
        return lib.asarray(x) if kind == "cupy" else lib.from_numpy(x).cuda()
    q, k, v = map(device, qkv((2, 4, 100, 64), dtype=np.float32))
    first = flash_attention_forward(q, k, v, causal=True)
    again = flash_attention_forward(q, k, v, causal=True)
    assert len(checked) == 1
    assert all(bool((a == b).all()) for a, b in zip(first, again))
    # the same shape and dtype, not contiguous: refused every time, memo or not
    wide = device(np.zeros((2, 4, 100, 128), np.float32))
    for _ in range(2):
        with pytest.raises(ValueError, match="non-contiguous"):
            flash_attention_forward(q, k, wide[..., :64], causal=True)
    assert len(checked) == 3
    if kind == "torch":
        # a lazy negation (its memory holds -v) after a call that replays from a plan: refused
        # every time, plan or memo or not (read as stored it would give v's answer)
        flash_attention_forward(q, k, v, causal=True)
        for _ in range(2):
            with pytest.raises(ValueError, match="negative bit"):
                flash_attention_forward(q, k, lib._neg_view(v), causal=True)


def test_device_arrays_must_be_readable_as_stored():
    torch = pytest.importorskip("torch")
    from numba_flash import arrays
    x = torch.zeros(2, 3, 8, 4)
    arrays.check_stored("q", x)
    arrays.check_stored("q", np.zeros((4, 8)).T)        # NumPy: copied to the device anyway
    with pytest.raises(ValueError, match="non-contiguous"):
        arrays.check_stored("q", x.transpose(2, 3))
    with pytest.raises(ValueError, match=r"negative bit.*q\.resolve_neg\(\)"):
        arrays.check_stored("q", torch._neg_view(x))


def test_bench_ratios_give_each_range_and_the_point_furthest_behind():
    from numba_flash import bench
    rows = (("numba-flash wgmma", "fwd", False, 1024, 42.0),
            ("torch efficient", "fwd", False, 1024, 30.0),
            ("numba-flash wgmma", "fwd", True, 1024, 33.0),
            ("torch efficient", "fwd", True, 1024, 30.0),
            ("numba-flash wgmma", "fwd", False, 4096, 50.0),     # no peer figure here
            ("numba-flash wgmma", "fwd+bwd", False, 1024, 40.0))
    records = [dict(impl=impl, mode=mode, d=64, causal=causal, N=n, tflops=t)
               for impl, mode, causal, n, t in rows]
    records.append(dict(impl="torch efficient", mode="fwd+bwd", d=64, causal=False, N=1024,
                        error="OutOfMemoryError: ..."))            # no ratio from an error
    assert bench.ratios(records) == ("fwd numba-flash wgmma / torch efficient: 1.10-1.40x "
                                     "over 2 points, lowest d=64 N=1024 causal")
    assert bench.ratios(records[:1]) == ""
