"""Proof that the property suite has teeth: it catches every deliberately broken kernel."""

import pytest
from hypothesis import Phase

from numba_flash.testing import campaign, mutants


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the NaN a mutant makes on the simulator
@pytest.mark.parametrize("name", sorted(mutants.MUTANTS))
def test_property_suite_catches_mutant(name):
    mutant = mutants.MUTANTS[name]
    with mutants.registered(name) as kernel:
        with pytest.raises(AssertionError, match="FAIL"):
            # no shrinking: finding one failing example is the point, and fast
            campaign.search(mutant.prop, kernel, "simulator",
                            max_examples=40, derandomize=True, phases=[Phase.generate],
                            print_blob=False)


def test_every_mutant_edits_the_current_source():
    for mutant in mutants.MUTANTS.values():
        mutants.build(mutant)          # raises if the fragment is gone or ambiguous


def test_unmutated_kernels_pass_the_same_search():
    # the control: the same search on the real kernels finds nothing
    for prop, kernel in (("forward agrees", "rowwise"), ("forward agrees", "tiled"),
                         ("forward agrees", "fa2"), ("backward agrees", "tiled"),
                         ("backward agrees", "fa2"), ("backward agrees", "fa2-atomic")):
        campaign.search(prop, kernel, "simulator", max_examples=4,
                        derandomize=True, phases=[Phase.generate])
