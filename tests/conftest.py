"""Run on the CUDA simulator when there is no GPU; skip `gpu`-marked tests there."""

import pytest

import numba_flash  # turns the simulator on when no GPU is present
from numba_flash.testing import profiles

# Hypothesis profile for every test: ci on the simulator, gpu on a GPU ($HYPOTHESIS_PROFILE wins)
PROFILE, SIZE = profiles.load(simulator=numba_flash.SIMULATOR)


def pytest_collection_modifyitems(config, items):
    if not numba_flash.SIMULATOR:
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU (running on the CUDA simulator)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_plans_across_tests():
    """Each test starts without forward plans (numba_flash.replay): a plan remembers what a
    call did, so a test that changes a module's state (a grid limit, a dispatch) must not
    meet one an earlier test made on memory at the same address."""
    from numba_flash import replay
    replay.clear()
    yield


@pytest.fixture
def hold_stream():
    """hold_stream(ptr): a context manager under which the CUDA stream of pointer ptr waits
    for the host (cuStreamWaitValue32 on a flag in mapped host memory, set when the block
    ends): work queued on it inside the block cannot run before the block ends. A call that
    waits on the host for that stream would never return: after `seconds` a timer sets the
    flag; the context manager yields a function that says whether the timer had to (then the
    block waited for the stream)."""
    import contextlib
    import threading

    import numpy as np

    @contextlib.contextmanager
    def hold(ptr, seconds=30.0):
        from cuda.bindings import driver
        from numba import cuda
        flag = cuda.mapped_array(1, dtype=np.uint32)
        flag[0] = 0
        (err,) = driver.cuStreamWaitValue32(
            driver.CUstream(ptr), driver.CUdeviceptr(flag.__cuda_array_interface__["data"][0]),
            1, driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
        assert err == driver.CUresult.CUDA_SUCCESS, err
        timer = threading.Timer(seconds, lambda: flag.__setitem__(0, 1))
        timer.start()
        try:
            yield lambda: not timer.is_alive() and flag[0] == 1
        finally:
            timer.cancel()
            flag[0] = 1
            cuda.external_stream(ptr).synchronize()
    return hold
