"""kernels/sm90/tma.py: the 128-byte swizzle's layout, boxes with their zero fill, mbarrier
phases (and a wait that would hang a GPU), which arrays TMA takes, the tensor-map cache, and
the wgmma16 forward on TMA against float64 truth and against its cp.async staging, bit for
bit (simulator; GPU under the gpu marker)."""

import ml_dtypes
import numpy as np
import pytest
from numba import cuda, uint16

from numba_flash import flash_attention_forward, registry
from numba_flash.kernels.sm90 import forward16, tma
from numba_flash.kernels.support import ALIGN, SIMULATOR
from numba_flash.testing.tolerance import assert_within_tolerance, check_forward


def test_swizzle128_is_a_permutation_of_8_row_atoms_with_chunks_xored_by_the_row():
    R, C = 64, 128
    r, c = np.meshgrid(np.arange(R), np.arange(C), indexing="ij")
    off = tma.swizzle128_offset_host(r, c, R)
    assert sorted(off.ravel()) == list(range(R * C))
    # row r of a box: 128 bytes at 128 r; its 16-byte chunk j (8 elements) at chunk j ^ (r % 8)
    for row in (0, 1, 7, 8, 13):
        for j in range(8):
            assert off[row, 8 * j] == 64 * row + 8 * (j ^ (row % 8))
            assert list(off[row, 8 * j:8 * j + 8]) == list(range(off[row, 8 * j],
                                                                   off[row, 8 * j] + 8))
    assert off[0, 64] == R * 64          # columns 64.. : the second box, R rows further


def box_kernel(loads):
    """One block of 32 threads: thread 0 starts `loads` boxes of src at (c0, c1, c2) = coords
    row i into box i's tile on one mbarrier (one phase), everyone waits, then copies the tiles
    (as stored, swizzled) into dst (loads x 4096)."""
    NBYTES = loads * tma.BOX_BYTES + tma.MBARRIER_BYTES + tma.SWIZZLE_ALIGN
    BAR = loads * tma.BOX_BYTES

    @cuda.jit
    def boxes(src, maps, coords, dst, parity):
        sh = cuda.shared.array(0, uint16, alignment=ALIGN)
        base = tma.swizzle_base(sh)
        bar = 2 * base + BAR
        if cuda.threadIdx.x == 0:
            tma.mbarrier_init(sh, bar, 1)
            tma.mbarrier_fence_init()
            tma.tensormap_acquire(maps, 0)
        cuda.syncthreads()
        for phase in range(2):      # the same boxes twice: parity 0, then 1
            if cuda.threadIdx.x == 0:
                tma.mbarrier_expect_tx(sh, bar, loads * tma.BOX_BYTES)
                for i in range(loads):
                    tma.tma_load(sh, base + i * tma.BOX_ELEMENTS, maps, 0, src, coords[i, 0],
                                 coords[i, 1], coords[i, 2], bar)
            tma.mbarrier_wait(sh, bar, phase)
            cuda.syncthreads()
        for e in range(cuda.threadIdx.x, loads * tma.BOX_ELEMENTS, 32):
            dst[e // tma.BOX_ELEMENTS, e % tma.BOX_ELEMENTS] = sh[base + e]
        parity[0] = 1
    return boxes, NBYTES


def test_tma_boxes_land_swizzled_with_zeros_past_the_array():
    # (B*H, N, d) = (3, 100, 72): a box inside, one past the rows (N = 100) and the columns
    # (d = 72: columns 64..127 hold 8 of them), and one of the last head
    rng = np.random.default_rng(0)
    src = rng.integers(1, 60000, (3, 100, 72)).astype(np.uint16)
    coords = np.array([[0, 0, 1], [64, 60, 0], [0, 36, 2]], np.int32)
    d_src = cuda.to_device(src)
    kernel, nbytes = box_kernel(len(coords))
    dst = np.zeros((len(coords), tma.BOX_ELEMENTS), np.uint16)
    done = np.zeros(1, np.int32)
    kernel[1, 32, 0, nbytes](d_src, tma.tensor_maps([d_src]), coords, dst, done)
    r, c = np.meshgrid(np.arange(tma.BOX), np.arange(tma.BOX), indexing="ij")
    off = tma.swizzle128_offset_host(r, c, tma.BOX)
    for i, (c0, c1, c2) in enumerate(coords):
        want = np.zeros((tma.BOX, tma.BOX), np.uint16)
        part = src[c2, c1:c1 + tma.BOX, c0:c0 + tma.BOX]
        want[:part.shape[0], :part.shape[1]] = part
        got = dst[i][off]                   # the box back in row order
        np.testing.assert_array_equal(got, want)
    assert done[0] == 1


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's model of a wait that never ends")
def test_simulated_mbarrier_wait_on_a_phase_that_never_completes_raises(monkeypatch):
    monkeypatch.setattr(tma, "HANG_SECONDS", 0.2)
    NBYTES = tma.MBARRIER_BYTES

    @cuda.jit
    def hang(out):
        sh = cuda.shared.array(0, uint16)
        if cuda.threadIdx.x == 0:
            tma.mbarrier_init(sh, 0, 1)
            tma.mbarrier_expect_tx(sh, 0, 16)  # one arrival, 16 bytes that never come
        cuda.syncthreads()
        tma.mbarrier_wait(sh, 0, 0)
        out[cuda.threadIdx.x] = 1

    # one thread: nothing else of its block can run, so the wait raises at once; two: each
    # yields its turn to the other until HANG_SECONDS have passed
    for threads in (1, 2):
        with pytest.raises(tma.MbarrierHang, match="never completed"):
            hang[1, threads, 0, NBYTES](np.zeros(2, np.int32))


def test_tma_ready_takes_16_byte_aligned_rows_and_strides():
    a = np.zeros((2, 10, 64), np.uint16)
    assert tma.tma_ready(a)
    assert not tma.tma_ready(np.zeros((2, 10, 60), np.uint16))   # rows of 120 bytes
    assert not tma.tma_ready(a[:, :, 4:])                     # data 8 bytes past an alignment
    assert tma.tma_ready(a[:, :, 8:])                         # 56 columns of rows of 64
    assert tma.tma_ready(a[:, ::2, :])                        # every other row: 256 bytes


def test_tensor_maps_are_cached_by_pointer_shape_strides_and_stream():
    a, b = (cuda.to_device(np.zeros((1, 64, 64), np.uint16)) for _ in range(2))
    first = tma.tensor_maps([a, b])
    assert tma.tensor_maps([a, b]) is first
    assert tma.tensor_maps([b, a]) is not first
    assert first.shape == (2, tma.MAP_BYTES)
    stream = cuda.stream()
    on_stream = tma.tensor_maps([a, b], stream)       # its own copy, ordered on that stream
    assert on_stream is not first and tma.tensor_maps([a, b], stream) is on_stream


@pytest.mark.gpu
def test_tensor_maps_in_a_torch_process_come_from_its_pools_on_the_stream():
    """Where torch runs CUDA, a new set of maps is torch memory copied on the call's stream
    (no cuMemAlloc, no copy from pageable memory, no cuMemFree, which waits for the device),
    holding each array's map as encoded, and cached as before."""
    torch = pytest.importorskip("torch")
    if SIMULATOR or not torch.cuda.is_available():
        pytest.skip("needs a real CUDA GPU and torch with CUDA")
    x, y = (torch.zeros((1, 64, 64 + 8 * i), dtype=torch.int16, device="cuda")
            for i in range(2))
    a, b = cuda.as_cuda_array(x), cuda.as_cuda_array(y)
    side = torch.cuda.Stream()
    stream = cuda.external_stream(side.cuda_stream)
    maps = tma.tensor_maps([a, b], stream)
    held = maps.owner.array
    assert isinstance(held, torch.Tensor) and held.data_ptr() == maps.ptr
    assert tma.tensor_maps([a, b], stream) is maps
    side.synchronize()
    words = held.cpu().numpy().view(np.uint64).reshape(2, -1)
    assert (words == np.stack([tma._encode(a), tma._encode(b)])).all()


def _forward(fmt, shape_q, shape_k, causal, seed=0, scale_logits=1.0):
    rng = np.random.default_rng(seed)
    dt = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[fmt]
    q = (rng.standard_normal(shape_q) * scale_logits).astype(dt)
    k, v = (rng.standard_normal(shape_k).astype(dt) for _ in range(2))
    out, lse = flash_attention_forward(q, k, v, causal=causal, kernel="wgmma16")
    assert_within_tolerance(check_forward(q, k, v, out, lse, causal=causal))
    # the same products on the same tiles staged by cp.async (another layout): the same bits
    same = cp_async_forward(q, k, v, causal)
    assert out.tobytes() == same[0].tobytes() and lse.tobytes() == same[1].tobytes()


def cp_async_forward(q, k, v, causal):
    """(out, lse) of wgmma16's forward staged by cp.async (tma=False), through a variant
    registered for the call only (other tests count the registered pairs)."""
    name = "wgmma16 cp.async (test)"
    registry.register(registry.variant(name, "wgmma16",
                                       make_forward=forward16.make_forward_kernel))
    try:
        return flash_attention_forward(q, k, v, causal=causal, kernel=name)
    finally:
        registry.PAIRS.pop(name)


# causal 130 x 270 at d = 64: five K/V blocks, so stages are refilled (the fifth block into
# the first stage, its mbarrier's second phase: parity 1) while wgmma may read the stages
# beside them (the simulator's in-flight check); the second query block's upper warpgroup
# (rows 192..255) lies past Nq and only waits (the stage-only tail: on the simulator it ran
# ahead of the computing warpgroup until exchanges were warpgroup barriers). GQA with
# Nq != Nk at d = 96 (D = 128, three warpgroups, columns past d zero), five K/V blocks too
@pytest.mark.parametrize("fmt,shape_q,shape_k,causal", [
    ("bfloat16", (1, 1, 130, 64), (1, 1, 270, 64), True),
    ("float16", (1, 2, 33, 96), (1, 1, 270, 96), False)])
def test_wgmma16_tma_forward_within_the_half_tolerance(fmt, shape_q, shape_k, causal):
    assert registry.PAIRS["wgmma16"].make_forward.keywords == {"tma": True}
    _forward(fmt, shape_q, shape_k, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape_q,shape_k,causal,logits", [
    ((2, 4, 1000, 64), (2, 4, 1000, 64), False, 1.0),
    ((2, 4, 1000, 64), (2, 2, 1500, 64), True, 1.0),
    ((1, 4, 777, 128), (1, 4, 513, 128), True, 1.0),
    ((1, 2, 1024, 96), (1, 2, 1024, 96), False, 30.0),
    ((1, 2, 4096, 128), (1, 2, 4096, 128), True, 1.0)])
def test_gpu_wgmma16_tma_forward_within_the_half_tolerance(fmt, shape_q, shape_k, causal,
                                                            logits):
    _forward(fmt, shape_q, shape_k, causal, scale_logits=logits)
