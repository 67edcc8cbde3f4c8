"""The simulator shims of kernels/support.py: static shared arrays are one per (file, line) for
all of a block's threads, however the threads interleave."""

import sys
import threading

import numpy as np
import pytest

from numba_flash.kernels.support import SIMULATOR


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


def slow_empty(monkeypatch):
    """np.empty that yields the GIL (sleeps) before allocating: every thread that found no
    array yet then allocates one, the interleaving that breaks an unlocked lookup."""
    import time
    real = np.empty

    def empty(*args, **kwargs):
        time.sleep(1e-3)
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
    slow_empty(monkeypatch)
    assert len(arrays_seen(namespace["FakeCUDAShared"](0), threads=16)) > 1
    for _ in range(5):
        assert len(arrays_seen(kernelapi.FakeCUDAShared(0), threads=16)) == 1
