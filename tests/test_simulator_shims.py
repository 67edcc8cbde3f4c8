"""The simulator as kernels/simulator.py runs it: static shared arrays are one per (file, line)
for all of a block's threads, however the threads interleave; block barriers keep CUDA's
meaning (live threads only, an exception raised and the rest aborted); pool threads start each
block with fresh state; device functions see the launch's fake `cuda`, and their modules get
the real one back when the launch ends."""

import sys
import warnings
import threading

import numpy as np
import pytest

from numba_flash.kernels.support import SIMULATOR
from numba import cuda  # noqa: E402  (after numba_flash: the simulator on without a GPU)


def arrays_seen(shared, threads=64):
    """The ids of the arrays that `threads` threads get from one line, released together."""
    barrier, seen = threading.Barrier(threads), []

    def body():
        barrier.wait()
        seen.append(id(shared.array((8, 8), np.float32)))

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)                  # interleave as finely as Python can
    try:
        workers = [threading.Thread(target=body) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(before)
    return set(seen)


def slow_empty(monkeypatch, threads):
    """np.empty that waits (up to 1 s) until `threads` threads are inside it before it
    allocates: every thread that found no array yet then allocates one, the interleaving that
    breaks an unlocked lookup, made certain (a 1 ms sleep made it likely only: under load the
    first thread could store its array before the others looked, and the control failed in a
    CI run, 2026-12-04). A locked lookup lets one thread in, which goes on after the wait."""
    real, inside = np.empty, threading.Barrier(threads)

    def empty(*args, **kwargs):
        try:
            inside.wait(timeout=1.0)
        except threading.BrokenBarrierError:     # fewer threads came (the locked lookup)
            pass
        return real(*args, **kwargs)
    monkeypatch.setattr(np, "empty", empty)


@pytest.mark.skipif(not SIMULATOR, reason="a shim of the simulator")
def test_static_shared_array_is_one_per_line_for_every_thread(monkeypatch):
    import inspect

    from numba.cuda.simulator import kernelapi
    assert kernelapi.FakeCUDAShared.array._locked
    # the control: numba-cuda's own (unlocked) method hands out several arrays here
    namespace = dict(vars(kernelapi))
    exec(inspect.getsource(kernelapi.FakeCUDAShared), namespace)
    slow_empty(monkeypatch, threads=16)
    assert len(arrays_seen(namespace["FakeCUDAShared"](0), threads=16)) > 1
    for _ in range(5):
        assert len(arrays_seen(kernelapi.FakeCUDAShared(0), threads=16)) == 1


# The pooled threads and their barriers (simulator.run_blocks_on_a_thread_pool)

def _within(seconds, work):
    """work() in a thread; fails the test if it has not returned in time (a barrier that never
    opens would hang the suite instead)."""
    done, errors = [], []

    def call():
        try:
            done.append(work())
        except BaseException as e:          # noqa: BLE001 - handed to the test
            errors.append(e)
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s: a barrier never opened"
    if errors:
        raise errors[0]
    return done[0]


@pytest.mark.skipif(not SIMULATOR, reason="a shim of the simulator")
def test_barriers_order_shared_memory_round_after_round():
    from numba.cuda.simulator import kernel as simkernel
    assert simkernel.BlockManager.run._pooled
    n, rounds = 64, 6

    @cuda.jit
    def rotate(out):
        # each round every thread takes its right neighbour's value: right only if no thread
        # writes round r + 1 before every thread has read round r, and none reads early
        sm = cuda.shared.array(64, np.int64)
        t = cuda.threadIdx.x
        x = t
        for _ in range(rounds):
            sm[t] = x
            cuda.syncthreads()
            x = sm[(t + 1) % n]
            cuda.syncthreads()
        out[cuda.blockIdx.x, t] = x + cuda.syncthreads_count(t % 2 == 0)

    out = np.zeros((3, n), np.int64)
    _within(60, lambda: rotate[3, n](out))
    assert (out == (np.arange(n) + rounds) % n + n // 2).all()


@pytest.mark.skipif(not SIMULATOR, reason="a shim of the simulator")
def test_threads_that_exit_early_do_not_hold_a_barrier_and_errors_are_raised():

    @cuda.jit
    def half_exit(out):
        t = cuda.threadIdx.x
        if t >= 16:                       # these leave; the barriers count the rest only
            return
        out[t] = t
        cuda.syncthreads()
        x = out[(t + 1) % 16]
        cuda.syncthreads()
        out[t] += x

    out = np.zeros(32, np.int64)
    _within(60, lambda: half_exit[1, 32](out))
    right = np.arange(16) + (np.arange(16) + 1) % 16
    assert (out[:16] == right).all() and (out[16:] == 0).all()

    @cuda.jit
    def one_fails(out):
        t = cuda.threadIdx.x
        cuda.syncthreads()
        out[t + (100 if t == 5 else 0)] = 1     # thread 5 indexes past the end
        cuda.syncthreads()

    with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\]"):
        _within(60, lambda: one_fails[1, 16](np.zeros(16, np.int64)))
    out = np.zeros(32, np.int64)                  # the next launch runs as usual
    _within(60, lambda: half_exit[1, 32](out))
    assert (out[:16] == right).all()


@pytest.mark.skipif(not SIMULATOR, reason="a shim of the simulator")
def test_pool_threads_serve_every_block_with_fresh_state_and_real_indices():
    from numba_flash.kernels import simulator

    @cuda.jit
    def mark(out, idx):
        state = simulator.thread_state()
        t = cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y
        out[cuda.blockIdx.x, t] = state.get("seen", 0)       # 0: nothing left by a block
        state["seen"] = 1
        idx[cuda.blockIdx.x, t, 0] = cuda.threadIdx.x
        idx[cuda.blockIdx.x, t, 1] = cuda.threadIdx.y
        idx[cuda.blockIdx.x, t, 2] = threading.get_ident()

    out, idx = np.full((5, 12), -1, np.int64), np.zeros((5, 12, 3), np.int64)
    _within(60, lambda: mark[5, (4, 3)](out, idx))
    assert (out == 0).all()
    assert (idx[:, :, 0] == np.arange(12) % 4).all() and (idx[:, :, 1] == np.arange(12) // 4).all()
    # the same 12 Python threads ran every block: none was made for a block
    assert len(set(idx[:, :, 2].ravel())) == 12
    first = set(idx[:, :, 2].ravel())
    _within(60, lambda: mark[2, (4, 3)](out, idx))
    assert set(idx[:2, :, 2].ravel()) == first and (out[:2] == 0).all()


@pytest.mark.skipif(not SIMULATOR, reason="a shim of the simulator")
def test_device_functions_see_the_launch_module_and_get_the_real_one_back():
    from numba.cuda.simulator import kernel as simkernel

    @cuda.jit(device=True)
    def lane_plus(x):
        return cuda.threadIdx.x % 32 + x      # the fake module's thread index

    @cuda.jit
    def kernel(out):
        out[cuda.threadIdx.x] = lane_plus(100)

    out = np.zeros(40, np.int64)
    _within(60, lambda: kernel[1, 40](out))
    assert (out == np.arange(40) % 32 + 100).all()
    assert globals()["cuda"] is cuda and simkernel._kernel_context is None
    # a swap per call (numba-cuda's own path) is gone for modules known at launch
    assert simkernel.FakeCUDAKernel.__call__._pinned


@pytest.mark.skipif(not SIMULATOR, reason="a shim of the simulator")
def test_a_blocks_threads_run_one_at_a_time_and_meet_in_both_orders():
    # one thread runs at a time, even across calls that let the GIL go (NumPy's large
    # products); after each barrier the others run in an order that alternates, so that every
    # two threads run in both orders (a write racing a read is seen one way round or the other)
    running, most, order = [0], [0], []
    lock = threading.Lock()
    a = np.ones((200, 200))

    def segment(t):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            order.append(t)
        a @ a                                   # the GIL is let go in here
        with lock:
            running[0] -= 1

    n, rounds = 6, 4

    @cuda.jit
    def turns(out):
        t = cuda.threadIdx.x
        for _ in range(rounds):
            segment(t)
            cuda.syncthreads()
        out[t] = 1

    out = np.zeros(n, np.int64)
    _within(60, lambda: turns[1, n](out))
    assert (out == 1).all() and most[0] == 1
    rounds_seen = [order[r * n:(r + 1) * n] for r in range(rounds)]
    assert all(sorted(r) == list(range(n)) for r in rounds_seen)
    for i in range(n):
        for j in range(i + 1, n):
            before = {r.index(i) < r.index(j) for r in rounds_seen}
            assert before == {True, False}, (i, j, rounds_seen)


@pytest.mark.skipif(not SIMULATOR, reason="a shim of the simulator")
def test_threads_waiting_at_barriers_that_cannot_open_raise_instead_of_hanging():
    from numba_flash.kernels import simulator

    @cuda.jit
    def crossed(out):
        # thread 0 waits for its block, thread 1 for its warpgroup: each barrier waits for
        # the other thread, which waits at the other barrier (a GPU would hang)
        if cuda.threadIdx.x == 0:
            cuda.syncthreads()
        else:
            simulator.warpgroup_barrier()
        out[cuda.threadIdx.x] = 1

    with pytest.raises(RuntimeError, match="cannot open"):
        _within(60, lambda: crossed[1, 2](np.zeros(2, np.int64)))


@pytest.mark.skipif(not SIMULATOR, reason="a shim of the simulator")
def test_a_thread_that_ends_leaving_barriers_that_cannot_open_raises_and_none_starts_late():
    from numba_flash.kernels import simulator
    started = []

    @cuda.jit
    def crossed_then_end(out):
        # thread 0 waits for its block, thread 1 for its warpgroup, thread 2 ends: then no
        # thread can run (a GPU would hang)
        t = cuda.threadIdx.x
        if t == 0:
            cuda.syncthreads()
        elif t == 1:
            simulator.warpgroup_barrier()
        out[t] = 1

    with pytest.raises(RuntimeError, match="cannot open"):
        _within(60, lambda: crossed_then_end[1, 3](np.zeros(3, np.int64)))

    @cuda.jit
    def first_fails(out):
        # thread 0 fails in its first turn: the rest, woken by the abort, do not run the kernel
        started.append(cuda.threadIdx.x)
        out[cuda.threadIdx.x + (100 if cuda.threadIdx.x == 0 else 0)] = 1

    with pytest.raises(IndexError, match=r"tid=\[0, 0, 0\]"):
        _within(60, lambda: first_fails[1, 16](np.zeros(16, np.int64)))
    assert started == [0]


@pytest.mark.skipif(not SIMULATOR, reason="a shim of the simulator")
def test_kernel_arithmetic_gives_ieee_results_without_numpy_warnings():
    # A GPU raises no floating-point flags: -inf - -inf is NaN (a row that has seen no key),
    # 1 / 0 is inf, float32's largest doubled overflows to inf, all silently.

    @cuda.jit
    def ieee(x, out):
        t = cuda.threadIdx.x
        if t == 0:
            out[0] = x[0] - x[0]                 # -inf - -inf
        elif t == 1:
            out[1] = x[1] / x[2]                 # 1 / 0
        else:
            out[2] = x[3] * x[4]                 # 3.4e38 * 2

    x = np.array([-np.inf, 1, 0, np.finfo(np.float32).max, 2], np.float32)
    out = np.zeros(3, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # a warning in a simulated thread raises
        _within(60, lambda: ieee[1, 3](x, out))
    assert np.isnan(out[0]) and out[1] == np.inf and out[2] == np.inf
