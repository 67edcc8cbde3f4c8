"""`numba-flash verify`'s GPU cases, as a test (shares compiled kernels with test_kernels)."""

import pytest

from numba_flash import verify
from numba_flash.testing import GPU_CASES


@pytest.mark.gpu
def test_verify_gpu_cases_all_pass():
    rows = list(verify.run_checks(GPU_CASES))
    failed = [r for r in rows if not r["ok"]]
    assert rows and not failed, "\n".join(map(str, failed))
