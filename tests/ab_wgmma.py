"""The wgmma backward (kernels/backward_wgmma.py) and its options on a GPU, not a pytest module.

    python tests/ab_wgmma.py check [NAME ...]  # odd float32 cases within tolerance (exit 1
                                              # if not); under compute-sanitizer too
    python tests/ab_wgmma.py time [--d D] [NAME ...]  # A/B against the default backward
                                              # (fa2-atomic): TFLOP/s, alternating, two
                                              # rounds, one process (d = 64 unless given)
    python tests/ab_wgmma.py ncu [NAME]       # one wgmma backward at N = 2k, for
                                              # ncu -k regex:wgmma

Everything goes through the API, the kernel registered here as "fa2-wgmma" and its options
under their own names (NAME: every one of them if none is given). Timing uses the benchmark's
grid (B*H = (16384 / N) (2048 / d)), d = 64 (or --d), N = 1k, 2k, 4k, and counts the backward
as 2.5x the forward's FLOPs.
"""
import functools
import sys

import numpy as np
from numba import cuda

import reference as ref
from numba_flash import flash_attention_backward, flash_attention_forward
from numba_flash.bench import _median_ms
from numba_flash.kernels import (DEFAULT_BACKWARD, backward_wgmma, backward_wgmma_wide,
                                 register_backward)
from numba_flash.testing import Case, check_backward

NAME = "fa2-wgmma"
register_backward(NAME, backward_wgmma.run_backward, backward_wgmma.default_blocks)
# the options of backward_wgmma.make_dkdv_kernel, each registered under its own name
# (the runs of 2026-11-30 named them by what differs from chained=False, the default then)
OPTIONS = {"fa2-wgmma, steps": dict(chained=False),
           "fa2-wgmma, steps, unpaired": dict(chained=False, paired=False),
           "fa2-wgmma, prefetch": dict(prefetch=True),
           "fa2-wgmma, prefetch, unpaired": dict(prefetch=True, paired=False),
           "fa2-wgmma, lean": dict(lean=True),
           "fa2-wgmma, lean, paired steps": dict(lean=True, paired_steps=True),
           "fa2-wgmma, lean, paired steps, ahead": dict(lean=True, paired_steps=True,
                                                        ahead=True)}
for name, options in OPTIONS.items():
    register_backward(name, functools.partial(backward_wgmma.run_backward, **options),
                      backward_wgmma.default_blocks)
VARIANTS = (NAME, *OPTIONS)
# the two-warpgroup kernel for 64 < d <= 128 (time --d 128 "fa2-wgmma, wide")
WIDE = "fa2-wgmma, wide"
register_backward(WIDE, backward_wgmma_wide.run_backward, backward_wgmma.default_blocks)
register_backward(WIDE + ", ahead", functools.partial(backward_wgmma_wide.run_backward,
                                                      ahead=True),
                  backward_wgmma.default_blocks)

# partial tiles, several Q blocks and K/V blocks, GQA, causal with masked rows, d < 64
CASES = (Case("odd", 1, 2, 1, 37, 45, 59, causal=True),
         Case("masked", 1, 1, 1, 70, 20, 17, causal=True),
         Case("one row", 1, 1, 1, 1, 33, 64),
         Case("several tiles", 1, 2, 1, 150, 300, 64),
         Case("several tiles, causal", 1, 3, 3, 200, 130, 32, causal=True),
         Case("logits x1e3", 1, 2, 2, 256, 256, 64, logit_scale=1e3),
         # for the wide kernels only (d > 64)
         Case("one row, d = 128", 1, 1, 1, 1, 33, 128),
         Case("several tiles, causal, GQA, d = 111", 1, 4, 2, 200, 130, 111, causal=True),
         Case("logits x1e3, d = 128", 1, 2, 2, 256, 256, 128, logit_scale=1e3))


def check(kernels=VARIANTS):
    bad = 0
    for case, name in ((c, n) for c in CASES for n in kernels):
        if case.d > 64 and WIDE not in name:
            continue
        q, k, v, dout = case.inputs(np.float32)
        out, lse = flash_attention_forward(q, k, v, causal=case.causal)
        grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                         kernel=name)
        for c in check_backward(dout, q, k, v, *grads, causal=case.causal):
            bad += not c.ok
            print(f"{name} {case}: {c.name} max err {c.max_err:.3e} allowed {c.allowed:.3e} "
                  f"{'ok' if c.ok else 'FAIL'}", flush=True)
    return 1 if bad else 0


def time_ab(d=64, sizes=(1024, 2048, 4096), variants=VARIANTS):
    rng = np.random.default_rng(0)
    for n in sizes:
        bh = (16384 // n) * (2048 // d)
        q, k, v, do = (cuda.to_device(rng.standard_normal((1, bh, n, d), dtype=np.float32))
                       for _ in range(4))
        out, lse = flash_attention_forward(q, k, v)
        flops = 2.5 * ref.forward_flops(n, n, d, False, bh)
        ours = flash_attention_backward(do, q, k, v, out, lse, kernel=variants[0])
        base = flash_attention_backward(do, q, k, v, out, lse)
        diff = max(float(np.max(np.abs(a.copy_to_host() - b.copy_to_host())))
                   for a, b in zip(ours, base))
        print(f"d={d} N={n}: max |{variants[0]} - {DEFAULT_BACKWARD}| = {diff:.2e}",
              flush=True)
        for rnd in range(2):
            for name in (DEFAULT_BACKWARD, *variants):
                ms = _median_ms(lambda: flash_attention_backward(do, q, k, v, out, lse,
                                                                 kernel=name))
                print(f"d={d} N={n} round {rnd} {name}: {ms:.2f} ms, "
                      f"{flops / ms / 1e9:.1f} TFLOP/s", flush=True)


def one_for_ncu(name=NAME, d=64, n=2048):
    rng = np.random.default_rng(0)
    q, k, v, do = (cuda.to_device(rng.standard_normal((16384 // n, 2048 // d, n, d),
                                                      dtype=np.float32)) for _ in range(4))
    out, lse = flash_attention_forward(q, k, v)
    for _ in range(2):
        flash_attention_backward(do, q, k, v, out, lse, kernel=name)
    cuda.synchronize()


if __name__ == "__main__":
    what, names = (sys.argv[1:2] or ["time"])[0], sys.argv[2:]
    if what == "check":
        sys.exit(check(names or VARIANTS))
    if what == "ncu":
        sys.exit(one_for_ncu(*names[:1]))
    d = 64
    if names[:1] == ["--d"]:
        d, names = int(names[1]), names[2:]
    time_ab(d=d, variants=names or VARIANTS)
