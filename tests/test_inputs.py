"""What odd input gets: the right answer or a clear error before any launch (issue 22).

Scales that do not survive the dtype, array-likes, lengths past 32 bits, more heads than a grid
dimension holds, two threads at once; the order causal blocks take."""

import threading

import numpy as np
import pytest

import reference as ref
from numba_flash import flash_attention_backward, flash_attention_forward, registry
from numba_flash.kernels import support
from numba_flash.testing import check_backward, check_forward
from numba import cuda  # noqa: I001 (after numba_flash, which picks the simulator without a GPU)


def qkv(shape=(1, 2, 5, 4), dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(dtype) for _ in range(3))


@pytest.mark.parametrize("scale,error,match", [
    (1e39, ValueError, "becomes inf"),             # finite in float64, inf in float32
    (1e-46, ValueError, "becomes 0"),              # 0 in float32
    ("abc", TypeError, "scale must be a real number, got 'abc'"),
    (True, TypeError, "scale must be a real number"),
    ([0.5], TypeError, "scale must be a real number"),
    (1 + 2j, TypeError, "scale must be a real number"),
])
def test_scale_is_checked_in_the_kernels_dtype(scale, error, match):
    with pytest.raises(error, match=match):
        flash_attention_forward(*qkv(), scale=scale)


def test_a_scale_that_fits_float64_only_runs_in_float64():
    q, k, v = qkv(dtype=np.float64)
    out, lse = flash_attention_forward(q, k, v, scale=1e-300)
    truth_out, truth_lse = ref.attention_forward(q, k, v, scale=1e-300)
    np.testing.assert_allclose(out, truth_out, rtol=1e-12, atol=1e-12)


def test_lists_are_taken_as_numpy_takes_them():
    q, k, v = qkv(dtype=np.float64)
    out, lse = flash_attention_forward(q.tolist(), k.tolist(), v.tolist())
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    truth_out, truth_lse = flash_attention_forward(q, k, v)
    np.testing.assert_array_equal(out, truth_out)
    dq, dk, dv = flash_attention_backward(q.tolist(), q, k, v, out.tolist(), lse.tolist())
    assert dq.shape == q.shape


@pytest.mark.parametrize("bad,match", [
    ([[1.0, "a"]], "q must be one of float16, bfloat16, float32, float64"),
    ([[1.0], [1.0, 2.0]], "q must be an array or array-like"),
    (None, "q must be one of float16, bfloat16, float32, float64"),
])
def test_what_numpy_cannot_make_an_array_of_is_a_type_error(bad, match):
    with pytest.raises(TypeError, match=match):
        flash_attention_forward(bad, *qkv()[1:])


@pytest.mark.parametrize("kernel", [["fa2"], 3, None])
def test_kernel_names_are_strings(kernel):
    with pytest.raises(TypeError, match="kernel must be a registered name"):
        flash_attention_forward(*qkv(), kernel=kernel)


def test_lengths_past_31_bits_raise_before_any_launch():
    # zero-stride views: the shape of 2^31 rows without the memory
    long = np.broadcast_to(np.zeros((1, 1, 4), np.float32), (1, 2**31, 4))
    short = np.zeros((1, 3, 4), np.float32)
    with pytest.raises(ValueError, match="below 2\\^31"):
        flash_attention_forward(long, short, short)
    with pytest.raises(ValueError, match="below 2\\^31"):
        flash_attention_forward(short, long, long)


def test_more_heads_than_a_signed_32_bit_count_raise():
    many = np.broadcast_to(np.zeros((1, 1, 1, 4), np.float32), (2**16, 2**15, 1, 4))
    with pytest.raises(ValueError, match="at most 2\\^31 - 1 query heads"):
        flash_attention_forward(many, many, many)


@pytest.mark.parametrize("kernel", sorted(registry.PAIRS))
def test_heads_past_grid_y_spill_into_grid_z(monkeypatch, kernel):
    # GRID_Y_LIMIT 2 makes 3 heads a grid of y 2, z 2: one block past the last head returns
    monkeypatch.setattr(support, "GRID_Y_LIMIT", 2)
    assert support.head_grid(3) == (2, 2)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((3, 1, 3, 4)).astype(np.float32)
    k = rng.standard_normal((3, 1, 4, 4)).astype(np.float32)
    v = rng.standard_normal((3, 1, 4, 4)).astype(np.float32)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=True, kernel=kernel)
    check = check_forward(q, k, v, out, lse, causal=True)
    assert all(c.ok for c in check), check
    grads = flash_attention_backward(dout, q, k, v, out, lse, causal=True, kernel=kernel)
    check = check_backward(dout, q, k, v, *grads, causal=True)
    assert all(c.ok for c in check), check


def test_head_grid_covers_every_head_count_up_to_the_limit():
    for n in (1, 2, 65535, 65536, 70000, 131072, 2**31 - 1):
        y, z = support.head_grid(n)
        assert y <= 65535 and z <= 65535 and y * z >= n and y * (z - 1) < n


@pytest.mark.parametrize("chunk", (1, 3))
@pytest.mark.parametrize("blocks, heads", ((1, 3), (5, 1), (5, 3), (8, 3)))
def test_causal_block_order_takes_every_block_once_heaviest_first(monkeypatch, blocks, heads,
                                                                 chunk):
    # support.make_block_order on a grid (blocks, head_grid(heads)) whose heads spill into z
    # (GRID_Y_LIMIT 2): every (query block, head) once, the blocks past the last head told
    # so, and in launch order: with chunks of 1, every head's last query block (the
    # heaviest), then every head's one before it, and so on
    monkeypatch.setattr(support, "GRID_Y_LIMIT", 2)
    monkeypatch.setattr(support, "CAUSAL_CHUNK", chunk)
    order = support.make_block_order(True)

    @cuda.jit
    def probe(n_heads, xs, hs):
        x, head = order(n_heads)
        i = cuda.blockIdx.x + cuda.gridDim.x * (cuda.blockIdx.y + cuda.blockIdx.z * cuda.gridDim.y)
        xs[i] = x
        hs[i] = head

    y, z = support.head_grid(heads)
    xs, hs = np.zeros(blocks * y * z, np.int64), np.zeros(blocks * y * z, np.int64)
    probe[(blocks, y, z), 1](heads, xs, hs)
    seen = [(x, h) for x, h in zip(xs, hs) if h < heads]
    assert sorted(seen) == [(x, h) for x in range(blocks) for h in range(heads)]
    assert sum(hs >= heads) == blocks * (y * z - heads)
    # chunk by chunk of ranks (0 the last query block), every head's in turn, in rank order
    ranks = [(r, h) for c in range(0, blocks, chunk) for h in range(heads)
             for r in range(c, min(c + chunk, blocks))]
    assert seen == [(blocks - 1 - r, h) for r, h in ranks]


def in_threads(work, n):
    """{i: work(i)} for i < n, each call in a thread of its own, all started at once; a
    thread's exception fails the test (it would be lost in the thread)."""
    results, errors = {}, []

    def call(i):
        try:
            results[i] = work(i)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def test_two_threads_at_once_get_right_answers():
    problems = [qkv(seed=s) for s in range(4)]
    results = in_threads(lambda i: flash_attention_forward(*problems[i], kernel="fa2"),
                         len(problems))
    for i, (q, k, v) in enumerate(problems):
        check = check_forward(q, k, v, *results[i])
        assert all(c.ok for c in check), check


@pytest.mark.gpu
def test_gpu_many_heads_against_float64_truth():
    # B*H = 70000 and 131072 failed at launch (CUDA_ERROR_INVALID_VALUE) with heads in grid y
    for heads in (70000, 131072):
        rng = np.random.default_rng(heads)
        q, k, v, dout = (rng.standard_normal((heads, 1, 8, 64)).astype(np.float32)
                         for _ in range(4))
        out, lse = flash_attention_forward(q, k, v, causal=True)
        check = check_forward(q, k, v, out, lse, causal=True)
        assert all(c.ok for c in check), check
        grads = flash_attention_backward(dout, q, k, v, out, lse, causal=True)
        check = check_backward(dout, q, k, v, *grads, causal=True)
        assert all(c.ok for c in check), check


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["auto", "fa2"])
def test_gpu_two_threads_at_once(kernel):
    problems = [qkv((2, 4, 300, 64), seed=s) for s in range(6)]

    def work(i):
        q, k, v = problems[i]
        out, lse = flash_attention_forward(q, k, v, causal=True, kernel=kernel)
        return out, lse, flash_attention_backward(q, q, k, v, out, lse, causal=True,
                                                  kernel=kernel)

    results = in_threads(work, len(problems))
    for i, (q, k, v) in enumerate(problems):
        out, lse, grads = results[i]
        check = (check_forward(q, k, v, out, lse, causal=True)
                 + check_backward(q, q, k, v, *grads, causal=True))
        assert all(c.ok for c in check), check


def test_one_step_import_is_a_device_view_and_refuses_a_wrong_one(monkeypatch):
    # arrays._import views an exporter's memory as a DeviceView of the kernels' shape and
    # type (no Numba device array): its pointer, C-contiguous, the exporter kept alive; the
    # host waits for the exporter's stream only when it is another than the kernels'; a
    # shape of another size or a type of another item size is refused, not viewed
    from numba import cuda

    from numba_flash import arrays
    from numba_flash.kernels.launch import DeviceView
    waited = []

    class Stream:
        def __init__(self, ptr):
            self.ptr = ptr

        def synchronize(self):
            waited.append(self.ptr)
    monkeypatch.setattr(cuda, "external_stream", Stream, raising=False)

    class Exporter:     # a C-contiguous (2, 6) int16 device array whose work is on stream 7
        __cuda_array_interface__ = {"shape": (2, 6), "typestr": "<i2", "data": (1234, False),
                                    "version": 3, "strides": None, "stream": 7}
    x = Exporter()
    view = arrays._import(x, (1, 3, 4), np.uint16, 7)
    assert type(view) is DeviceView and view.owner is x
    assert (view.ptr, view.shape, view.dtype, view.strides) == \
        (1234, (1, 3, 4), np.dtype(np.uint16), (24, 8, 2))
    assert view.__cuda_array_interface__["typestr"] == "<u2" and waited == []
    assert arrays._import(x, (12,), None, 0).dtype == np.int16 and waited == [7]  # another
    with pytest.raises(ValueError, match="cannot view"):
        arrays._import(x, (5, 2), None, 0)
    with pytest.raises(ValueError, match="cannot view"):
        arrays._import(x, (12,), np.float32, 0)
    assert Exporter.__cuda_array_interface__["shape"] == (2, 6)    # the exporter's untouched
