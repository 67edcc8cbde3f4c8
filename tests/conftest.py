"""Run on the CUDA simulator when there is no GPU; skip `gpu`-marked tests there."""

import sys

import pytest

import numba_flash  # turns the simulator on when no GPU is present
from numba_flash.testing import profiles

# Hypothesis profile for every test: ci on the simulator, gpu on a GPU ($HYPOTHESIS_PROFILE wins)
PROFILE, SIZE = profiles.load(simulator=numba_flash.SIMULATOR)

if numba_flash.SIMULATOR:
    # The simulator runs one Python thread per CUDA thread, and every device-function call takes
    # a per-module lock (numba-cuda's swapped_cuda_module). With the default 5 ms GIL switch
    # interval a preempted lock holder stalls the block's other threads for a whole interval:
    # the 128-thread wgmma backward took minutes per tile; at 0.1 ms, 19 s for a whole problem.
    sys.setswitchinterval(1e-4)


def pytest_collection_modifyitems(config, items):
    if not numba_flash.SIMULATOR:
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU (running on the CUDA simulator)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
