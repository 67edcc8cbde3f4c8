"""`numba-flash verify`: every registered kernel over a fixed set of cases against truth."""

import sys
import time

import numpy as np

from .api import flash_attention_backward, flash_attention_forward
from .kernels import BACKWARD, FORWARD, forward_for
from .testing import GPU_CASES, SIMULATOR_CASES, check_backward, check_forward

DTYPES = (np.float32, np.float64)


def run_checks(cases, dtypes=DTYPES, forward=None, backward=None):
    """Yield one row per (kernel, dtype, case, output): dict with kernel, dtype, case,
    output, max_err, allowed, ok, note."""
    forward = sorted(FORWARD) if forward is None else forward
    backward = sorted(BACKWARD) if backward is None else backward
    for case in cases:
        for dtype in dtypes:
            q, k, v, dout = case.inputs(dtype)
            results = {}
            for name in forward:
                results[name] = flash_attention_forward(q, k, v, causal=case.causal, kernel=name)
                for c in check_forward(q, k, v, *results[name], causal=case.causal):
                    yield _row(f"fwd/{name}", dtype, case, c)
            for name in backward:
                # each backward consumes the forward it follows (BackwardVariant.forward), by
                # default the default forward
                source = forward_for(name)
                if source not in results:
                    results[source] = flash_attention_forward(q, k, v, causal=case.causal,
                                                              kernel=source)
                out, lse = results[source]
                grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                                 kernel=name)
                for c in check_backward(dout, q, k, v, *grads, causal=case.causal):
                    yield _row(f"bwd/{name}", dtype, case, c)


def _row(kernel, dtype, case, c):
    return dict(kernel=kernel, dtype=np.dtype(dtype).name, case=f"{case.name}: {case}",
                output=c.name, max_err=c.max_err, allowed=c.allowed, ok=c.ok, note=c.note)


def main(simulator, quiet=False, forward=None, backward=None):
    """Print the table; return 0 when every row passes, 1 otherwise, 2 for an unknown kernel.
    forward, backward: names of registered kernels to check (None: all of them)."""
    forward = sorted(FORWARD) if forward is None else list(forward)
    backward = sorted(BACKWARD) if backward is None else list(backward)
    unknown = [f"forward {n}" for n in forward if n not in FORWARD] + \
        [f"backward {n}" for n in backward if n not in BACKWARD]
    if unknown or not (forward or backward):
        print(f"verify: unknown kernels {unknown}; forward {sorted(FORWARD)}, backward "
              f"{sorted(BACKWARD)}" if unknown else "verify: no kernel chosen", file=sys.stderr)
        return 2
    cases = SIMULATOR_CASES if simulator else GPU_CASES
    where = ("the CUDA simulator (no GPU found), at small sizes" if simulator
             else "the GPU")
    print(f"numba-flash verify: {len(cases)} cases on {where}; kernels forward "
          f"{forward}, backward {backward}; truth one precision up")
    header = f"{'kernel':<13} {'dtype':<8} {'out':<4} {'max err':>10} {'allowed':>10}  pass  case"
    print(header)
    failed = 0
    t0 = time.time()
    for row in run_checks(cases, forward=forward, backward=backward):
        failed += not row["ok"]
        if quiet and row["ok"]:
            continue
        print(f"{row['kernel']:<13} {row['dtype']:<8} {row['output']:<4} {row['max_err']:>10.3e} "
              f"{row['allowed']:>10.3e}  {'yes ' if row['ok'] else 'NO  '}  {row['case']}"
              + (f"  ({row['note']})" if row["note"] else ""), flush=True)
    print(f"{'all passed' if not failed else f'{failed} FAILED'} in {time.time() - t0:.0f} s")
    return 1 if failed else 0
