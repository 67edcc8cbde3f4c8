"""Every registered kernel at a few odd shapes, for compute-sanitizer (not a pytest module):

    compute-sanitizer --tool memcheck --error-exitcode 1 python tests/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python tests/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python tests/sanitize.py fa2-atomic

Kernel names given as arguments restrict the run to those registered kernels (forward or
backward); the default forward then still runs, to give the backward its out and lse.
Exits non-zero if any result is outside tolerance, so the sanitizer run checks answers too.
"""

import sys

import numpy as np

from numba_flash import flash_attention_backward, flash_attention_forward
from numba_flash.kernels import BACKWARD, DEFAULT_FORWARD, FORWARD
from numba_flash.testing import Case, check_backward, check_forward

# the last two span several K/V tiles at every kernel's default tiles, so that fa2's prefetch of
# the next tile (and the barriers around it) runs under the sanitizer
CASES = (Case("odd", 1, 2, 1, 37, 45, 59, causal=True), Case("masked", 1, 1, 1, 70, 20, 17, causal=True),
         Case("one row", 1, 1, 1, 1, 33, 128), Case("several tiles", 1, 2, 1, 70, 300, 64),
         Case("several tiles, causal", 1, 1, 1, 130, 200, 128, causal=True))


def main(names=()):
    unknown = set(names) - set(FORWARD) - set(BACKWARD)
    if unknown:
        sys.exit(f"sanitize: no registered kernel named {', '.join(sorted(unknown))}")
    forward = sorted(n for n in FORWARD if not names or n in names) or [DEFAULT_FORWARD]
    backward = sorted(n for n in BACKWARD if not names or n in names)
    bad = 0
    for case in CASES:
        for dtype in (np.float32, np.float64):
            q, k, v, dout = case.inputs(dtype)
            for name in forward:
                out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel=name)
                bad += sum(not c.ok for c in check_forward(q, k, v, out, lse, causal=case.causal))
            for name in backward:
                grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                                 kernel=name)
                bad += sum(not c.ok for c in check_backward(dout, q, k, v, *grads,
                                                            causal=case.causal))
            print(f"{case} {np.dtype(dtype).name}: done", flush=True)
    print(f"sanitize: {bad} comparisons outside tolerance")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
