"""Proof that the property suite has teeth: it catches every deliberately broken kernel."""

import pytest
from hypothesis import Phase

from numba_flash.api import DTYPES
from numba_flash.kernels.support import SIMULATOR
from numba_flash.testing import campaign, mutants
from numba_flash.testing.strategies import REGIMES


@pytest.mark.parametrize("name", sorted(mutants.MUTANTS))
def test_property_suite_catches_mutant(name):
    mutant = mutants.MUTANTS[name]
    if mutant.simulator_only and not SIMULATOR:
        pytest.skip("the edit is in the simulator's model of an instruction the GPU runs")
    with mutants.registered(name) as kernel:
        # caught by a comparison (FAIL) or, on the simulator, by the model of products in
        # flight (wgmma16.InFlightHazard: an operand changed before the wait, an AssertionError)
        with pytest.raises(AssertionError, match="FAIL|in flight"):
            # no shrinking: finding one failing example is the point, and fast
            campaign.search(mutant.prop, kernel, mutant.size,
                            max_examples=40, derandomize=True, phases=[Phase.generate],
                            print_blob=False, regimes=mutant.regimes or REGIMES,
                            dtypes=mutant.dtypes or DTYPES)


def test_every_mutant_edits_the_current_source():
    for mutant in mutants.MUTANTS.values():
        mutants.build(mutant)          # raises if the fragment is gone or ambiguous


# the searches the mutants take, each once: (property, pair, size, regimes, dtypes)
SEARCHES = sorted({(m.prop, m.base, m.size, m.regimes, m.dtypes)
                   for m in mutants.MUTANTS.values()}, key=repr)


@pytest.mark.parametrize("search", SEARCHES, ids=lambda s: " ".join(map(str, s)))
def test_unmutated_kernels_pass_the_same_search(search):
    # the control: each mutant's search, on the real pair it is a mutant of, finds nothing
    prop, kernel, size, regimes, dtypes = search
    campaign.search(prop, kernel, size, max_examples=2, derandomize=True,
                    phases=[Phase.generate], regimes=regimes or REGIMES,
                    dtypes=dtypes or DTYPES)


def test_every_family_has_mutants():
    bases = {m.base for m in mutants.MUTANTS.values()}
    assert bases == {"rowwise", "tiled", "fa2", "wgmma", "wgmma16"}, bases
    hopper = {m.kind for m in mutants.MUTANTS.values() if m.base == "wgmma"}
    assert hopper == {"forward", "backward"}
