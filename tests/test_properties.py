"""Every property for every registered kernel, under the loaded Hypothesis profile
(ci on the simulator, gpu on a GPU; HYPOTHESIS_PROFILE overrides)."""

import pytest
from conftest import SIZE

from numba_flash import registry
from numba_flash.kernels import mma16, support
from numba_flash.kernels.sm90 import backward16, forward16, wgmma16
from numba_flash.testing import campaign

# On the simulator two pairs compute what others compute already, so there they get the two
# properties that show they are wired (forward agrees, backward agrees) and not the rest,
# which were ~350 s of CI's ~20 minutes (2026-12-04): "mma16" is forward16 and backward16 on
# mma16.products16, which on the simulator is wgmma16's model (its own backward path, dQ by
# scalar atomics, is in "backward agrees"); "wgmma16-tf32bwd" is wgmma16's forward and the
# "wgmma" backward, whose properties run on half inputs too. On a GPU every pair gets every
# property.
SIMULATED_TWICE = ("mma16", "wgmma16-tf32bwd")
WIRING = ("forward agrees", "backward agrees")


def _pairs():
    return [(prop, kernel) for prop, kernel in campaign.pairs()
            if not (support.SIMULATOR and kernel in SIMULATED_TWICE and prop not in WIRING)]


@pytest.mark.parametrize("prop,kernel", _pairs())
def test_property(prop, kernel):
    campaign.search(prop, kernel, SIZE)


@pytest.mark.skipif(not support.SIMULATOR, reason="the simulator's duplicates only")
def test_the_pairs_left_to_wiring_checks_are_simulated_by_others():
    # what SIMULATED_TWICE says of them holds: their products are another pair's model and
    # their halves other pairs' kernels
    assert mma16.products16 is wgmma16.products16
    assert mma16.make_wait is wgmma16.make_wait
    tf32bwd, wgmma, half = (registry.PAIRS[n] for n in ("wgmma16-tf32bwd", "wgmma", "wgmma16"))
    assert tf32bwd.make_forward is half.make_forward
    assert half.make_forward.func is forward16.make_forward_kernel
    assert half.make_forward.keywords == {"tma": True}
    assert tf32bwd.run_backward is backward16.run_widened
    m = registry.PAIRS["mma16"]
    assert m.make_forward.func is forward16.make_forward_kernel
    assert m.run_backward.func is backward16.run_backward
    assert wgmma.half_inputs                # wgmma's own properties draw half inputs too
    kept = {(p, k) for p, k in _pairs() if k in SIMULATED_TWICE}
    assert kept == {(p, k) for p in WIRING for k in SIMULATED_TWICE}
