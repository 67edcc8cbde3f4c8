"""vector_io's offset accessors read and add where plain indexing would: load2_below(src, head,
row, col, k) is src[head, row + k, col:col + 2], load4_below(src, head, row, col, down, right)
src[head, row + down, col + right:][:4], add2_if_below(dst, head, row, col, k, x, ok) adds x at
dst[head, row + k, col:col + 2] where ok, and nothing where not, its address past dst's end or
not. On the simulator this checks the shims; on a GPU (sm_90: red.global.add.v2.f32) the
intrinsics (their offsets are 32-bit products of the row stride: rows wider than d, as views of
wider rows, and offsets down to the last row are drawn)."""

import numpy as np
import pytest
from numba import cuda

from numba_flash.kernels.launch import SIMULATOR
from numba_flash.kernels.support import U
from numba_flash.kernels.vector_io import add2_if_below, aligned, load2_below, load4_below


@cuda.jit
def _offsets_kernel(src, cases, pairs, runs, dst):
    n = cuda.grid(1)
    if n >= cases.shape[0]:
        return
    head, row, col = U(cases[n, 0]), U(cases[n, 1]), U(cases[n, 2])
    down, right = U(cases[n, 3]), U(cases[n, 4])
    pair = load2_below(src, head, row, col + right, down)
    run = load4_below(src, head, row, col, down, right)
    for e in range(2):
        pairs[n, e] = pair[e]
    for e in range(4):
        runs[n, e] = run[e]
    add2_if_below(dst, head, row, col + right, down, (pair[0], pair[1]), n % 3 != 2)
    if n == 0:      # not added: an address rows past dst's last (as add_dq_pairs' last rows)
        add2_if_below(dst, U(dst.shape[0] - 1), U(dst.shape[1]), col, U(1000), (pair[0],
                      pair[1]), False)


def test_offset_accessors_read_and_add_where_indexing_would():
    if not SIMULATOR and cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("add2_if_below's red.global.add.v2.f32 needs sm_90")
    rng = np.random.default_rng(7)
    wide = rng.standard_normal((3, 40, 24)).astype(np.float32)
    src = wide[:, :, 4:20]        # rows of 96 bytes holding 16 columns: the stride is not d
    src_device = cuda.to_device(wide)[:, :, 4:20]        # the same view on the device
    dst_parent = cuda.to_device(np.zeros((3, 40, 20), np.float32))
    dst_device = dst_parent[:, :, 4:]                    # rows of 80 bytes holding 16 columns
    assert aligned(src_device) and aligned(dst_device)
    heads, rows, cols = src.shape
    cases = []
    for _ in range(40):           # (head, row, col) and (down, right) inside src, 16-byte runs
        head, row, col = rng.integers(heads), rng.integers(rows), 4 * rng.integers(cols // 4)
        cases.append((head, row, col, rng.integers(rows - row), 4 * rng.integers(
            (cols - col) // 4)))
    cases.append((heads - 1, 0, 0, rows - 1, cols - 4))          # the farthest offsets
    cases = np.array(cases, np.int32)
    pairs = np.zeros((len(cases), 2), np.float32)
    runs = np.zeros((len(cases), 4), np.float32)
    _offsets_kernel[1, 64](src_device, cases, pairs, runs, dst_device)
    dst_all = dst_parent.copy_to_host()
    assert not dst_all[:, :, :4].any()                   # nothing left of the view
    dst = dst_all[:, :, 4:]
    expected_dst = np.zeros(src.shape, np.float32)
    for n, (head, row, col, down, right) in enumerate(cases):
        np.testing.assert_array_equal(runs[n], src[head, row + down, col + right:][:4])
        np.testing.assert_array_equal(pairs[n], src[head, row + down, col + right:][:2])
        if n % 3 != 2:
            expected_dst[head, row + down, col + right:][:2] += pairs[n]
    np.testing.assert_allclose(dst, expected_dst, rtol=1e-6)
    assert np.count_nonzero(dst) > 0 and np.count_nonzero(runs) == runs.size
