"""Every registered kernel pair at a few odd shapes, for compute-sanitizer:

    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 \\
        python tools/sanitize.py [NAME ...] [--dtype DTYPE ...]
    compute-sanitizer --tool racecheck --error-exitcode 1 python tools/sanitize.py wgmma

NAME ...: registered pairs (numba_flash.registry.PAIRS) to run; default all of them. Each pair
runs its own forward, then its backward from that forward's out and lse, with dQ by atomics
and deterministic (pairs with atomic_dq; the others have one backward), in float32 and
float64 (--dtype: these dtypes instead, e.g. bfloat16 float16, which also run the device
conversions to float32 and back) where the pair can run the case on this device (no fallback: a case the pair cannot
run is skipped and said so). Exits 1 if any result is outside the tolerance rule
(numba_flash.testing), so the sanitizer run checks answers too.

GPU cases: causal, GQA, Nq != Nk, fully masked rows, one query row, d in {1, 40, 59, 64, 72,
97, 128} (lean and wide Hopper kernels, vector and scalar paths), two spanning several K/V
tiles at every pair's default tiles (fa2's prefetch of the next tile and the barriers around
it run). On the simulator (no GPU) one tiny case instead, so that the script itself can be
checked anywhere (a few minutes for every pair).
"""

import sys
import time

import numpy as np

import numba_flash
from numba_flash import flash_attention_backward, flash_attention_forward, registry
from numba_flash.testing import Case, check_backward, check_forward

GPU_CASES = (
    Case("odd, causal, GQA", 1, 4, 2, 37, 45, 40, causal=True),
    Case("masked rows", 1, 1, 1, 70, 20, 72, causal=True),
    Case("one row", 1, 1, 1, 1, 33, 128),
    Case("d = 1", 1, 2, 2, 19, 23, 1),
    Case("odd d", 2, 2, 1, 50, 61, 59, causal=True),
    Case("odd wide d", 1, 2, 2, 66, 70, 97),
    Case("several tiles", 1, 2, 1, 70, 300, 64),
    Case("several tiles, causal", 1, 1, 1, 130, 200, 128, causal=True),
)
# one block of every kernel (the simulator runs a block's threads as OS threads: minutes)
SIMULATOR_CASES = (Case("tiny, causal, GQA, Nq != Nk", 1, 2, 1, 5, 7, 8, causal=True),)


def main(names=(), dtypes=("float32", "float64")):
    unknown = sorted(set(names) - set(registry.PAIRS))
    if unknown:
        sys.exit(f"sanitize: no registered pair named {', '.join(unknown)}; registered: "
                 f"{', '.join(sorted(registry.PAIRS))}")
    pairs = [registry.PAIRS[n] for n in (names or sorted(registry.PAIRS))]
    device = registry.current_device()
    cases = SIMULATOR_CASES if numba_flash.SIMULATOR else GPU_CASES
    bad = runs = 0
    for case in cases:
        for dtype in dtypes:
            q, k, v, dout = case.inputs(dtype)
            for pair in pairs:
                label = f"{pair.name} {case} {np.dtype(dtype).name}"
                if not registry.runs_itself(pair, case.d, dtype, device):
                    print(f"{label}: skipped (the pair cannot run it on {device})", flush=True)
                    continue
                t0 = time.perf_counter()
                out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel=pair.name)
                results = check_forward(q, k, v, out, lse, causal=case.causal)
                for deterministic in ((False, True) if pair.atomic_dq else (False,)):
                    grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                                     deterministic=deterministic,
                                                     kernel=pair.name)
                    results += check_backward(dout, q, k, v, *grads, causal=case.causal)
                failed = [c for c in results if not c.ok]
                bad += len(failed)
                runs += 1
                print(f"{label}: {'ok' if not failed else 'FAIL'} "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
                for c in failed:
                    print(f"    {c}", flush=True)
    print(f"sanitize: {runs} runs on {device}, {bad} comparisons outside tolerance")
    return 1 if bad else 0


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME")
    parser.add_argument("--dtype", nargs="+", dest="dtypes", default=["float32", "float64"],
                        choices=["float16", "bfloat16", "float32", "float64"])
    args = parser.parse_args()
    sys.exit(main(args.names, args.dtypes))
