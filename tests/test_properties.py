"""Every property for every registered kernel, under the loaded Hypothesis profile
(ci on the simulator, gpu on a GPU; HYPOTHESIS_PROFILE overrides)."""

import pytest
from conftest import SIZE

from numba_flash.testing import campaign


@pytest.mark.parametrize("prop,kernel", campaign.pairs())
def test_property(prop, kernel):
    campaign.search(prop, kernel, SIZE)
