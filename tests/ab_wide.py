"""The wide wgmma pair (64 < d <= 128: forward_wgmma_wide, backward_wgmma_wide) and its chained
options on a GPU, not a pytest module.

    python tests/ab_wide.py check [--small] [PAIR ...]  # odd float32 cases within tolerance,
                                              # and P recomputed exactly at logits x1e3 (exit 1
                                              # if not); --small: N < 1000 only (for
                                              # compute-sanitizer)
    python tests/ab_wide.py time [PAIR ...]    # forward, backward and forward+backward TFLOP/s
                                              # of each pair, alternating, two rounds, one
                                              # process, d = 128, N = 1k, 2k, 4k, 8k
    python tests/ab_wide.py ncu [PAIR]         # the pair's forward and backward twice at
                                              # d = 128, N = 2k, for ncu -k regex:wgmma_wide

A pair is a forward and the backward that recomputes its S bit for bit: "steps" (S in steps
from zero, as registered before 2026-12-02), "pv chained" (the forward's P V chained in the
tensor core per CHAIN steps; S as "steps"), "chained" (S, dP, P V, dV^T, dK^T, dQ^T all chained
per CHAIN steps), "rotated" (chained, the backward's Q blocks rotated and its dQ added by pairs:
registered 2026-12-02), "permuted" (rotated, S's contraction permuted within each chained
product so that Q's and dO's fragments load 16 bytes at a time). Each is registered here under "wide <pair>" for both passes; everything goes
through the API. Timing uses the benchmark's grid (B*H = (16384 / N) (2048 / d)).
"""
import functools
import sys

import numpy as np
from numba import cuda

import reference as ref
from numba_flash import flash_attention_backward, flash_attention_forward
from numba_flash.bench import _median_ms
from numba_flash.kernels import (backward_wgmma_wide, forward_wgmma, forward_wgmma_wide,
                                 register_backward, register_forward)
from numba_flash.testing import Case, check_backward, check_forward

PAIRS = {"steps": (dict(), dict(ahead=True)),
         "pv chained": (dict(pv_chained=True), dict(ahead=True)),
         "chained": (dict(pv_chained=True, s_chained=True),
                     dict(ahead=True, s_chained=True, w_chained=True)),
         "rotated": (dict(pv_chained=True, s_chained=True),
                     dict(ahead=True, s_chained=True, w_chained=True, rotate=True,
                          vector_atomics=True)),
         "permuted": (dict(pv_chained=True, s_chained=True, s_permuted=True, vector_loads=True),
                      dict(ahead=True, s_chained=True, w_chained=True, rotate=True,
                           vector_atomics=True, s_permuted=True, vector_loads=True))}


def _forward(forward_options, block_m, block_n, head_dim, causal, dtype):
    if not forward_wgmma_wide.applies(head_dim, dtype, block_m, block_n):
        raise ValueError(f"the wide forward does not apply to d = {head_dim}, {dtype}, "
                         f"{block_m} x {block_n} tiles")
    return forward_wgmma_wide.launcher(bool(causal), **forward_options)


for _pair, (_fwd, _bwd) in PAIRS.items():
    register_forward(f"wide {_pair}", functools.partial(_forward, _fwd),
                     forward_wgmma.default_blocks_or_fallback)
    register_backward(f"wide {_pair}", functools.partial(backward_wgmma_wide.run_backward,
                                                         **_bwd),
                      lambda head_dim, dtype: (64, 64), forward=f"wide {_pair}")

CASES = (Case("one row", 1, 1, 1, 1, 33, 128),
         Case("odd, causal, GQA, d = 111", 1, 4, 2, 200, 130, 111, causal=True),
         Case("masked rows, d = 72", 1, 1, 1, 70, 20, 72, causal=True),
         Case("N = 1000, d = 128, logits x30", 1, 2, 2, 1000, 1000, 128, logit_scale=30.0),
         Case("N = 2048, d = 128, causal", 1, 2, 2, 2048, 2048, 128, causal=True),
         Case("logits x1e3, d = 128", 1, 2, 2, 256, 256, 128, logit_scale=1e3))


def check(pairs=tuple(PAIRS), small=False):
    bad = 0
    cases = [c for c in CASES if not small or max(c.Nq, c.Nk) < 1000]
    for case, pair in ((c, p) for c in cases for p in pairs):
        name = f"wide {pair}"
        q, k, v, dout = case.inputs(np.float32)
        out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel=name)
        grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                         kernel=name)
        rows = (check_forward(q, k, v, out, lse, causal=case.causal)
                + check_backward(dout, q, k, v, *grads, causal=case.causal))
        for c in rows:
            bad += not c.ok
            print(f"{name} {case}: {c.name} max err {c.max_err:.3e} allowed {c.allowed:.3e} "
                  f"({c.max_err / c.allowed:.1%}) {'ok' if c.ok else 'FAIL'}", flush=True)
        if case.logit_scale >= 1e3:     # P recomputed bit for bit: dv far under its allowance
            dv = rows[-1]
            exact = dv.max_err < 1e-4 * dv.allowed
            bad += not exact
            print(f"{name} {case}: P recomputed exactly: {exact}", flush=True)
    return 1 if bad else 0


def time_ab(pairs=tuple(PAIRS), d=128, sizes=(1024, 2048, 4096, 8192)):
    rng = np.random.default_rng(0)
    for n in sizes:
        bh = (16384 // n) * (2048 // d)
        q, k, v, dout = (cuda.to_device(rng.standard_normal((1, bh, n, d), dtype=np.float32))
                         for _ in range(4))
        flops = ref.forward_flops(n, n, d, False, bh)
        for rnd in range(2):
            for pair in pairs:
                name = f"wide {pair}"
                out, lse = flash_attention_forward(q, k, v, kernel=name)
                fwd = _median_ms(lambda: flash_attention_forward(q, k, v, kernel=name))
                bwd = _median_ms(lambda: flash_attention_backward(dout, q, k, v, out, lse,
                                                                  kernel=name))
                print(f"d={d} N={n} round {rnd} {name}: forward {flops / fwd / 1e9:.1f}, "
                      f"backward {2.5 * flops / bwd / 1e9:.1f}, forward+backward "
                      f"{3.5 * flops / (fwd + bwd) / 1e9:.1f} TFLOP/s", flush=True)


def for_ncu(pair="chained", d=128, n=2048):
    rng = np.random.default_rng(0)
    q, k, v, dout = (cuda.to_device(rng.standard_normal((16384 // n, 2048 // d, n, d),
                                                        dtype=np.float32)) for _ in range(4))
    for _ in range(2):
        out, lse = flash_attention_forward(q, k, v, kernel=f"wide {pair}")
        flash_attention_backward(dout, q, k, v, out, lse, kernel=f"wide {pair}")
    cuda.synchronize()


if __name__ == "__main__":
    what, names = (sys.argv[1:2] or ["time"])[0], sys.argv[2:]
    if what == "check":
        small = "--small" in names
        names = [n for n in names if n != "--small"]
        sys.exit(check(names or tuple(PAIRS), small))
    elif what == "ncu":
        for_ncu(*names[:1])
    else:
        time_ab(names or tuple(PAIRS))
