"""`numba-flash verify`: every registered kernel pair (forward, then its backward on that
forward's out and lse) over a fixed set of cases against truth."""

import sys
import time

import numpy as np

from .api import flash_attention_backward, flash_attention_forward
from .registry import PAIRS
from .testing import GPU_CASES, SIMULATOR_CASES, check_backward, check_forward

DTYPES = (np.float32, np.float64)


def run_checks(cases, dtypes=DTYPES, kernels=None):
    """Yield one row per (kernel, dtype, case, output): dict with kernel, dtype, case,
    output, max_err, allowed, ok, note. kernels: registered pair names (default all)."""
    kernels = sorted(PAIRS) if kernels is None else kernels
    for case in cases:
        for dtype in dtypes:
            q, k, v, dout = case.inputs(dtype)
            for name in kernels:
                out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel=name)
                for c in check_forward(q, k, v, out, lse, causal=case.causal):
                    yield _row(f"fwd/{name}", dtype, case, c)
                grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                                 kernel=name)
                for c in check_backward(dout, q, k, v, *grads, causal=case.causal):
                    yield _row(f"bwd/{name}", dtype, case, c)


def _row(kernel, dtype, case, c):
    return dict(kernel=kernel, dtype=np.dtype(dtype).name, case=f"{case.name}: {case}",
                output=c.name, max_err=c.max_err, allowed=c.allowed, ok=c.ok, note=c.note)


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
