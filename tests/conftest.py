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
