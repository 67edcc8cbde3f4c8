"""`numba-flash verify`: every registered kernel pair (forward, then its backward on that
forward's out and lse) over a fixed set of cases against truth."""

import sys
import time

from .registry import PAIRS
from .testing import GPU_CASES, SIMULATOR_CASES
from .testing.campaign import run_checks



def main(simulator, quiet=False, kernels=None):
    """Print the table; return 0 when every row passes, 1 otherwise, 2 for an unknown kernel.
    kernels: names of registered pairs to check (None: all of them)."""
    kernels = sorted(PAIRS) if kernels is None else list(kernels)
    unknown = [n for n in kernels if n not in PAIRS]
    if unknown or not kernels:
        print(f"verify: unknown kernels {unknown}; registered: {sorted(PAIRS)}" if unknown
              else "verify: no kernel chosen", file=sys.stderr)
        return 2
    cases = SIMULATOR_CASES if simulator else GPU_CASES
    where = ("the CUDA simulator (no GPU found), at small sizes" if simulator
             else "the GPU")
    print(f"numba-flash verify: {len(cases)} cases on {where}; kernels {kernels} (forward "
          f"and backward); truth one precision up")
    header = f"{'kernel':<13} {'dtype':<8} {'out':<4} {'max err':>10} {'allowed':>10}  pass  case"
    print(header)
    failed = 0
    t0 = time.time()
    for row in run_checks(cases, kernels=kernels):
        failed += not row["ok"]
        if quiet and row["ok"]:
            continue
        print(f"{row['kernel']:<13} {row['dtype']:<8} {row['output']:<4} {row['max_err']:>10.3e} "
              f"{row['allowed']:>10.3e}  {'yes ' if row['ok'] else 'NO  '}  {row['case']}"
              + (f"  ({row['note']})" if row["note"] else ""), flush=True)
    print(f"{'all passed' if not failed else f'{failed} FAILED'} in {time.time() - t0:.0f} s")
    return 1 if failed else 0
