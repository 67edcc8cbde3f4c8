"""The kernels' opt-in options, each the same arithmetic as the default path: 16-byte global
accesses (kernels/vector_io.py): the fa2 forward's vector_loads (Q, K, V loads and the O store)
give the scalar path's bits, fa2-atomic's vector_atomics add the same dQ, the default takes the
vector path only for aligned arrays; the dK/dV kernel's prefetch of the next Q and dO tiles gives
the same bits; clear errors where an option cannot run."""

import numpy as np
import pytest

from numba_flash import flash_attention_forward
from numba_flash.kernels import backward_fa2, forward_fa2
from numba_flash.kernels.vector_io import AlignedDispatch, aligned
from numba_flash.testing import Case, check_backward, check_forward


def run(case, dtype, block_m, block_n, **options):
    q, k, v, _ = case.inputs(dtype)
    bh, d = q.shape[0] * q.shape[1], q.shape[-1]
    q3, k3, v3 = (x.reshape(-1, x.shape[2], d) for x in (q, k, v))
    kern, threads = forward_fa2.make_forward_kernel(block_m, block_n, d, case.causal,
                                                    np.dtype(dtype), **options)
    out = np.zeros_like(q3)
    lse = np.zeros(q3.shape[:2], dtype)
    kern[(-(-q3.shape[1] // block_m), bh), threads](q3, k3, v3, out, lse, dtype(d ** -0.5),
                                                    case.H, case.H // case.Hk)
    return (q, k, v), out.reshape(q.shape), lse.reshape(q.shape[:-1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("prefetch", [False, True])
def test_vector_loads_give_the_scalar_bits(dtype, prefetch):
    # several K/V tiles (the prefetch runs), a partial last tile, d below its padding
    case = Case("vector", 1, 2, 1, 21, 45, 12, causal=True)
    (q, k, v), out, lse = run(case, dtype, 16, 16, prefetch=prefetch, vector_loads=True)
    _, ref_out, ref_lse = run(case, dtype, 16, 16, prefetch=prefetch)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)
    assert all(c.ok for c in check_forward(q, k, v, out, lse, causal=True))


def test_vector_loads_need_d_a_multiple_of_4():
    with pytest.raises(ValueError, match="multiple of 4"):
        forward_fa2.make_forward_kernel(16, 16, 10, False, np.dtype(np.float32),
                                        vector_loads=True)


def test_vector_loads_reject_misaligned_arrays():
    flat = np.zeros(1 + 2 * 16 * 8, np.float32)
    good, bad = flat[:-1].reshape(2, 16, 8), flat[1:].reshape(2, 16, 8)   # bad: 4 bytes off
    assert aligned(good) and not aligned(bad)
    assert not aligned(np.zeros((2, 16, 6), np.float32))                    # 24-byte rows
    # rows of 16-byte aligned stride that a 16-byte access would overrun: a narrower view of
    # wider rows (the last 16 bytes reach past d), or a strided last axis
    wide = flat[:-1].reshape(2, 16, 8)
    assert not aligned(wide[:, :, :6]) and not aligned(wide[:, :, ::2])
    assert aligned(wide[:, :, 4:])                                           # 16 bytes in
    # heads 37 floats apart (not a multiple of 16 bytes): row 0 of head 1 is 4 bytes off
    def heads(apart):
        return np.lib.stride_tricks.as_strided(flat, (2, 4, 8), (apart * 4, 8 * 4, 4))
    assert not aligned(heads(37)) and aligned(heads(40))
    # a GPU array as Numba's DeviceNDArray presents it: the interface, shape, strides, dtype and
    # no .itemsize (checking a.itemsize broke every 16-bit launch on the GPU, not the simulator)
    class DeviceView:
        def __init__(self, a):
            self.shape, self.strides, self.ndim, self.dtype = a.shape, a.strides, a.ndim, a.dtype
            self.__cuda_array_interface__ = {"data": (a.ctypes.data, False)}
    assert not hasattr(DeviceView(good), "itemsize")
    assert aligned(DeviceView(good)) and not aligned(DeviceView(bad))
    assert not aligned(DeviceView(wide[:, :, :6]))
    kern, threads = forward_fa2.make_forward_kernel(16, 16, 8, False, np.dtype(np.float32),
                                                    vector_loads=True)
    out, lse = np.zeros_like(good), np.zeros((2, 16), np.float32)
    with pytest.raises(ValueError, match="16-byte aligned"):
        kern[(1, 2), threads](bad, good, good, out, lse, np.float32(0.3), 1, 1)


def misaligned_copy(x):
    """x's values in an array whose data pointer is 4 bytes past a 16-byte boundary."""
    flat = np.zeros(x.size + 4, x.dtype)
    start = (-flat.ctypes.data // x.itemsize) % 4 + 1      # elements to skip: 4 bytes off
    view = flat[start:start + x.size].reshape(x.shape)
    view[...] = x
    return view


def test_by_default_aligned_arrays_take_the_vector_path_and_misaligned_the_scalar():
    # float32, 64 < d <= 128: the default (vector_loads=None) dispatches on alignment
    case = Case("default", 1, 1, 1, 9, 20, 68)
    assert forward_fa2.vector_loads_by_default(68, np.float32)
    assert not forward_fa2.vector_loads_by_default(64, np.float32)
    assert not forward_fa2.vector_loads_by_default(68, np.float64)
    kern, threads = forward_fa2.make_forward_kernel(16, 16, 68, False, np.dtype(np.float32))
    assert isinstance(kern, AlignedDispatch)
    q, k, v, _ = case.inputs(np.float32)
    q3, k3, v3 = (x.reshape(-1, x.shape[2], 68) for x in (q, k, v))
    bad_q = misaligned_copy(q3)
    assert not aligned(bad_q)
    outs = []
    for args_q, path in ((q3, kern.vector), (bad_q, kern.scalar)):
        out, lse = np.zeros_like(q3), np.zeros(q3.shape[:2], np.float32)
        args = (args_q, k3, v3, out, lse, np.float32(68 ** -0.5), 1, 1)
        assert kern.pick(args) is path
        kern[(1, 1), threads](*args)
        outs.append((out, lse))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    assert all(c.ok for c in check_forward(q, k, v, outs[0][0].reshape(q.shape),
                                           outs[0][1].reshape(q.shape[:-1])))


def run_fa2_backward(case, dtype=np.float32, dq=None, block_m=16, block_n=16, **options):
    """(dout, q, k, v), [dq, dk, dv] from backward_fa2.run_backward with `options`
    (dq_atomic, vector_atomics, prefetch, tensor_cores: False unless given, so that the FFMA
    products are what the other options are tested on), out and lse from the default
    forward."""
    options.setdefault("tensor_cores", False)
    q, k, v, dout = case.inputs(dtype)
    out, lse = flash_attention_forward(q, k, v, causal=case.causal)
    d = q.shape[-1]
    q3, k3, v3, dout3, out3 = (x.reshape(-1, x.shape[2], d) for x in (q, k, v, dout, out))
    dq = np.zeros_like(q3) if dq is None else dq
    dk, dv = np.zeros_like(k3), np.zeros_like(v3)
    backward_fa2.run_backward(dout3, q3, k3, v3, lse.reshape(q3.shape[:2]), out3, dq, dk, dv,
                              scale=d ** -0.5, heads=case.H, group=case.H // case.Hk,
                              causal=case.causal, block_m=block_m, block_n=block_n, **options)
    return (dout, q, k, v), [x.reshape(y.shape) for x, y in ((dq, q), (dk, k), (dv, v))]


def test_vector_atomics_add_the_same_dq():
    # several K/V blocks add into each dQ row; d below the padding; GQA
    case = Case("vector atomics", 1, 2, 1, 20, 37, 12, causal=True)
    inputs, vec = run_fa2_backward(case, dq_atomic=True, vector_atomics=True)
    _, scalar = run_fa2_backward(case, dq_atomic=True, vector_atomics=False)
    assert all(c.ok for c in check_backward(*inputs, *vec, causal=True))
    np.testing.assert_array_equal(vec[1], scalar[1])    # dk and dv: no atomics, same bits
    np.testing.assert_array_equal(vec[2], scalar[2])
    np.testing.assert_allclose(vec[0], scalar[0], rtol=1e-5, atol=1e-6)   # sums reordered


def test_vector_atomics_need_float32_d_a_multiple_of_4_and_an_aligned_dq():
    with pytest.raises(ValueError, match="float32"):
        backward_fa2.make_dkdv_kernel(16, 16, 12, False, np.float64, dq_atomic=True,
                                      vector_atomics=True)
    with pytest.raises(ValueError, match="multiple of 4"):
        backward_fa2.make_dkdv_kernel(16, 16, 10, False, np.float32, dq_atomic=True,
                                      vector_atomics=True)
    case = Case("misaligned dq", 1, 1, 1, 5, 7, 8)
    with pytest.raises(ValueError, match="16-byte aligned"):
        run_fa2_backward(case, dq=misaligned_copy(np.zeros((1, 5, 8), np.float32)),
                         dq_atomic=True, vector_atomics=True)
    # the default falls back to scalar atomics for it
    inputs, grads = run_fa2_backward(case, dq=misaligned_copy(np.zeros((1, 5, 8), np.float32)),
                                     dq_atomic=True, vector_atomics=None)
    assert all(c.ok for c in check_backward(*inputs, *grads))


@pytest.mark.gpu
def test_gpu_vector_loads_give_the_scalar_bits():
    case = Case("vector, real size", 2, 4, 2, 1000, 1030, 128, causal=False)
    (q, k, v), out, lse = run(case, np.float32, 128, 64, vector_loads=True)
    _, ref_out, ref_lse = run(case, np.float32, 128, 64)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)


@pytest.mark.gpu
def test_gpu_vector_atomics_add_the_same_dq():
    case = Case("vector atomics, real size", 1, 4, 2, 700, 1030, 64, causal=True)
    inputs, vec = run_fa2_backward(case, dq_atomic=True, vector_atomics=True)
    _, scalar = run_fa2_backward(case, dq_atomic=True, vector_atomics=False)
    assert all(c.ok for c in check_backward(*inputs, *vec, causal=True))
    np.testing.assert_array_equal(vec[1], scalar[1])
    np.testing.assert_array_equal(vec[2], scalar[2])
    np.testing.assert_allclose(vec[0], scalar[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dq_atomic", [False, True])
def test_prefetch_gives_the_same_bits(dtype, dq_atomic):
    # several Q tiles per head (the prefetch runs), a partial last one, two query heads per
    # key head (a new head restarts without prefetch), causal (Q blocks skipped at the start)
    case = Case("prefetch", 1, 2, 1, 21, 30, 12, causal=True)
    inputs, got = run_fa2_backward(case, dtype, block_m=8, dq_atomic=dq_atomic, prefetch=True)
    _, ref = run_fa2_backward(case, dtype, block_m=8, dq_atomic=dq_atomic, prefetch=False)
    assert all(c.ok for c in check_backward(*inputs, *got, causal=True))
    exact = 1 if dq_atomic else 0                  # dq by atomics: sums in another order
    for g, r in zip(got[exact:], ref[exact:]):
        np.testing.assert_array_equal(g, r)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)


# run_backward's defaults where they were timed (float32, dQ by atomics: fa2-atomic) and only
# there: (make_dkdv_kernel's positional argument as run_backward passes it, the option as the
# tests' helper must pass it to get run_backward's default, expected where timed)
DEFAULTS = {"prefetch": (8, None, True), "tensor_cores": (9, "default", None)}


@pytest.mark.parametrize("option", sorted(DEFAULTS))
@pytest.mark.parametrize("dtype, dq_atomic", [(np.float32, True), (np.float32, False),
                                              (np.float64, True)])
def test_defaults_apply_where_they_were_timed(monkeypatch, option, dtype, dq_atomic):
    position, default, timed = DEFAULTS[option]
    seen = []
    make = backward_fa2.make_dkdv_kernel

    def recording(*args):
        seen.append(args[position])
        return make(*args)
    monkeypatch.setattr(backward_fa2, "make_dkdv_kernel", recording)
    run_fa2_backward(Case("default", 1, 1, 1, 5, 7, 8), dtype, dq_atomic=dq_atomic,
                     **{option: default})
    assert seen == [timed if dtype == np.float32 and dq_atomic else False]


@pytest.mark.gpu
def test_gpu_prefetch_gives_the_same_bits():
    case = Case("prefetch, real size", 1, 4, 2, 700, 1030, 64, causal=True)
    inputs, got = run_fa2_backward(case, block_m=64, block_n=128, prefetch=True)
    _, ref = run_fa2_backward(case, block_m=64, block_n=128, prefetch=False)
    assert all(c.ok for c in check_backward(*inputs, *got, causal=True))
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)


@pytest.mark.parametrize("dq_atomic", [False, True])
def test_tensor_cores_agree_with_truth_and_the_ffma_products(dq_atomic):
    # several Q tiles and K/V blocks, partial last ones, d below its padding, GQA, causal; two
    # warps per block, so fragments come from rows other warps wrote
    case = Case("tensor cores", 1, 2, 1, 21, 37, 12, causal=True)
    inputs, got = run_fa2_backward(case, dq_atomic=dq_atomic, tensor_cores=True)
    _, ref = run_fa2_backward(case, dq_atomic=dq_atomic)
    assert all(c.ok for c in check_backward(*inputs, *got, causal=True))
    for g, r in zip(got, ref):                      # the same sums, split and reordered
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_tensor_cores_need_float32_and_whole_warps():
    with pytest.raises(ValueError, match="float32"):
        backward_fa2.make_dkdv_kernel(16, 16, 12, False, np.float64, dq_atomic=True,
                                      tensor_cores=True)
    with pytest.raises(ValueError, match="whole warps"):
        backward_fa2.make_dkdv_kernel(16, 16, 12, False, np.float32, threads=(4, 4),
                                      tensor_cores=True)
    with pytest.raises(ValueError, match="multiple of 16"):
        backward_fa2.make_dkdv_kernel(8, 8, 12, False, np.float32, threads=(8, 4),
                                      tensor_cores=True)


@pytest.mark.gpu
@pytest.mark.parametrize("d, block_n", [(64, 128), (128, 64), (59, 128)])
def test_gpu_tensor_cores_agree_with_truth(d, block_n):
    case = Case("tensor cores, real size", 1, 4, 2, 700, 1030, d, causal=d != 64)
    inputs, got = run_fa2_backward(case, block_m=64, block_n=block_n, dq_atomic=True,
                                   tensor_cores=True)
    _, ref = run_fa2_backward(case, block_m=64, block_n=block_n, dq_atomic=True)
    assert all(c.ok for c in check_backward(*inputs, *got, causal=case.causal))
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("limit", [101376, 166912])       # sm_86/89 (99 KiB), A100 (163 KiB)
def test_fa2_default_tiles_fit_the_gpus_shared_memory(monkeypatch, limit):
    # the tiles are sized against this GPU's opt-in shared memory per block (the driver's
    # figure), not the H200's 227 KiB: there fa2's float32 forward at d > 32 and its backward
    # at d > 64 need 170-178 KB, which an A100 or an sm_86 cannot give a block
    from numba_flash.kernels import backward_fa2, support
    monkeypatch.setattr(support, "_device_shared_limit", lambda: limit)
    monkeypatch.setattr(support, "SIMULATOR", False)
    assert support.dynamic_shared_limit() == limit
    for dtype in (np.float32, np.float64):
        item = np.dtype(dtype).itemsize
        for d in (1, 32, 33, 64, 65, 128, 129, 256):
            if item == 8 and d > 128 and limit < 138496:   # 16 x 16 needs 138496 B there
                with pytest.raises(ValueError, match="no tile fits head dim"):
                    backward_fa2.default_blocks(d, dtype)
                continue
            bm, bn = forward_fa2.default_blocks(d, dtype)
            assert forward_fa2.shared_bytes(bm, bn, d, item) <= limit, (d, dtype, bm, bn)
            bm, bn = backward_fa2.default_blocks(d, dtype)
            assert backward_fa2.shared_bytes(bm, bn, d, item) <= limit, (d, dtype, bm, bn)
            bm, bn = backward_fa2.default_blocks_atomic(d, dtype)
            assert backward_fa2.shared_bytes(bm, bn, d, item, dq_atomic=True) <= limit
    # what the H200's default would take is refused with the reason, not launched to fail
    with pytest.raises(ValueError, match="shared memory"):
        forward_fa2.make_forward_kernel(128, 64, 128, False, np.dtype(np.float32))


def test_aligned_dispatch_takes_the_vector_path_only_where_grouped_arrays_share_strides():
    # stage16.Plan addresses K and V (Q and dO) with one set of strides: a caller's views with
    # different or negative strides must take the scalar kernel, not read the wrong rows
    vector, scalar = object(), object()
    kern = AlignedDispatch(vector, scalar, positions=(0, 1), same_strides=[(0, 1)])
    k = np.zeros((2, 8, 16), np.uint16)
    wide = np.zeros((2, 8, 32), np.uint16)[:, :, :16]     # aligned rows, a longer row stride
    assert aligned(k) and aligned(wide) and k.strides != wide.strides
    assert kern.pick((k, np.zeros_like(k))) is vector
    assert kern.pick((k, wide)) is scalar
    flipped = np.zeros((2, 8, 16), np.uint16)[:, ::-1, :]  # negative row stride: not aligned
    # (vector_io's offset accessors add zero-extended 32-bit offsets)
    assert not aligned(flipped) and kern.pick((flipped, flipped)) is scalar
    assert AlignedDispatch(vector, scalar, positions=(0, 1)).pick((k, wide)) is vector
    with pytest.raises(ValueError, match="among the aligned positions"):
        AlignedDispatch(vector, scalar, positions=(0,), same_strides=[(0, 1)])


def test_recompute_p_sums32_needs_the_select_form():
    """make_recompute_p's sums32 narrows the select form's causal test; asked of the branch
    form (which would ignore it) it is an error, not a silent no-op."""
    from numba import float32

    from numba_flash.kernels.support import make_recompute_p
    with pytest.raises(ValueError, match="sums32"):
        make_recompute_p(float32, True, sums32=True)
    assert callable(make_recompute_p(float32, True, select=True, sums32=True))
