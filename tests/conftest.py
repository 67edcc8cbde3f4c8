"""Run on the CUDA simulator when there is no GPU; skip `gpu`-marked tests there."""

import pytest

from numba_flash._gpu import use_simulator_without_gpu

SIMULATOR = use_simulator_without_gpu()  # before anything imports numba.cuda


def pytest_collection_modifyitems(config, items):
    if not SIMULATOR:
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU (running on the CUDA simulator)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
