"""The wgmma forward (kernels/forward_wgmma.py) and its options on a GPU, not a pytest module.

    python tests/ab_forward_wgmma.py check [NAME ...]  # odd float32 cases within tolerance
                                                      # (exit 1 if not)
    python tests/ab_forward_wgmma.py time [NAME ...]   # A/B against the fa2 forward: TFLOP/s,
                                                      # alternating, two rounds, one process

Each option of make_wgmma_kernel is registered here under its own name (NAME: all of them if
none is given); everything goes through the API. Timing uses the benchmark's grid
(B*H = (16384 / N) (2048 / d)), d = 64, N = 1k, 2k, 4k, not causal.
"""
import functools
import sys

import numpy as np
from numba import cuda

import reference as ref
from numba_flash import flash_attention_forward
from numba_flash.bench import _median_ms
from numba_flash.kernels import forward_wgmma, register_forward
from numba_flash.testing import Case, check_forward

OPTIONS = {"wgmma, P V paired steps": dict(pv_chained=False),
           "wgmma, unpaired": dict(paired=False, pv_chained=False),
           "wgmma, loads 8": dict(loads=8),
           "wgmma, prefetch": dict(prefetch=True)}
for name, options in OPTIONS.items():
    register_forward(name, functools.partial(forward_wgmma.make_forward_kernel, **options),
                     forward_wgmma.default_blocks_or_fallback)
VARIANTS = ("wgmma", *OPTIONS)

# partial tiles, several Q and K/V blocks, GQA, causal with masked rows, d < 64, large logits
CASES = (Case("odd", 1, 2, 1, 37, 45, 59, causal=True),
         Case("masked", 1, 1, 1, 70, 20, 17, causal=True),
         Case("several tiles", 1, 2, 1, 150, 300, 64),
         Case("several tiles, causal", 1, 3, 3, 200, 130, 32, causal=True),
         Case("logits x1e3", 1, 2, 2, 256, 256, 64, logit_scale=1e3))


def check(kernels=VARIANTS):
    bad = 0
    for case, name in ((c, n) for c in CASES for n in kernels):
        q, k, v, _ = case.inputs(np.float32)
        out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel=name)
        for c in check_forward(q, k, v, out, lse, causal=case.causal):
            bad += not c.ok
            print(f"{name} {case}: {c.name} max err {c.max_err:.3e} allowed {c.allowed:.3e} "
                  f"{'ok' if c.ok else 'FAIL'}", flush=True)
    return 1 if bad else 0


def time_ab(d=64, sizes=(1024, 2048, 4096), variants=VARIANTS):
    rng = np.random.default_rng(0)
    for n in sizes:
        bh = (16384 // n) * (2048 // d)
        q, k, v = (cuda.to_device(rng.standard_normal((1, bh, n, d), dtype=np.float32))
                   for _ in range(3))
        flops = ref.forward_flops(n, n, d, False, bh)
        for rnd in range(2):
            for name in ("fa2", *variants):
                ms = _median_ms(lambda: flash_attention_forward(q, k, v, kernel=name))
                print(f"d={d} N={n} round {rnd} {name}: {ms:.3f} ms, "
                      f"{flops / ms / 1e9:.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    what, names = (sys.argv[1:2] or ["time"])[0], sys.argv[2:]
    if what == "check":
        sys.exit(check(names or VARIANTS))
    time_ab(variants=names or VARIANTS)
