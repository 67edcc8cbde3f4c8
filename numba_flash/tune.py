"""`numba-flash tune`: time the forward and backward kernels over tile and thread shapes, to
choose defaults.

Each configuration (block_m, block_n, (TY, TX)) is first checked against the NumPy reference
on a small odd-sized problem (tolerance helper), then timed at N = 2048 (or --n) on the
benchmark grid (B * N = 16k, H = 2048 / d, float32, not causal). Prints TFLOP/s per configuration.
"""


import numpy as np

import reference as ref

from . import arrays
from .bench import median_ms
import functools

from .kernels import backward, backward_fa2, forward_fa2, forward_tiled
from .kernels.support import ceil_div, head_grid
from .testing import Case, check_backward, check_forward

FORWARD_MODULES = {"tiled": forward_tiled, "fa2": forward_fa2}
# the backward kernels tune times: the tiled one, fa2 with a dQ kernel, fa2 with dQ by atomics
BACKWARD_RUNS = {"tiled": backward.run_backward, "fa2": backward_fa2.run_backward,
                 "fa2-atomic": functools.partial(backward_fa2.run_backward, dq_atomic=True)}
# fa2 configurations carry a fourth entry, prefetch (None: the kernel's rule), and a fifth,
# vector_loads (16-byte global loads and O stores; None: forward_fa2.vector_loads_by_default)
FORWARD_CONFIGS = {("fa2", 64): [(64, 64, (8, 16), False, False), (64, 64, (8, 16), True, False),
                                 (128, 64, (16, 16), False, False),
                                 (128, 64, (16, 16), False, True),
                                 (128, 64, (16, 16), True, False),
                                 (128, 128, (16, 16), None, False),
                                 (128, 128, (16, 16), None, True)],
                   ("fa2", 128): [(128, 64, (16, 16), False, False),
                                  (128, 64, (16, 16), True, False),
                                  (128, 64, (16, 16), True, True),
                                  (128, 32, (16, 16), True, False),
                                  (128, 32, (16, 16), True, True),
                                  (64, 64, (8, 16), True, False),
                                  (64, 64, (8, 16), True, True),
                                  (128, 64, (32, 8), True, True)]}
FORWARD_CONFIGS |= {("tiled", d): configs for d, configs in {
    64: [(32, 64, (8, 16)), (32, 64, (4, 16)), (64, 32, (8, 8)), (64, 32, (16, 8)),
         (32, 32, (4, 8)), (32, 64, (8, 8))],
    128: [(32, 32, (8, 16)), (32, 32, (4, 16)), (32, 32, (8, 8)), (32, 32, (4, 8)),
          (16, 64, (4, 16)), (16, 64, (8, 16))],
}.items()}
BACKWARD_CONFIGS = {
    ("tiled", 64): [(32, 32, (8, 16)), (32, 32, (4, 16)), (32, 32, (8, 8)), (32, 32, (4, 8))],
    ("tiled", 128): [(16, 16, (8, 16)), (16, 16, (4, 16)), (16, 16, (8, 8)), (16, 16, (4, 8))],
    ("fa2", 64): [(64, 64, (16, 16)), (64, 64, (8, 16)), (32, 64, (8, 16)), (64, 32, (8, 16)),
                  (128, 64, (16, 16)), (64, 128, (16, 16))],
    ("fa2", 128): [(64, 64, (16, 16)), (64, 64, (8, 16)), (32, 64, (8, 16)), (64, 32, (8, 16)),
                   (32, 32, (8, 16)), (128, 64, (16, 16))],
    # fa2-atomic configurations may carry a fourth entry, vector_atomics (None: where possible),
    # a fifth, prefetch of the next Q and dO tiles (missing: run_backward's default, on in
    # float32), and a sixth, tensor_cores (the accumulating products on tensor cores, 3xTF32;
    # missing: on in float32)
    ("fa2-atomic", 64): [(64, 128, (16, 16), False, True), (64, 128, (16, 16), True, False),
                         (64, 128, (16, 16), True, True), (64, 64, (16, 16), True, True),
                         (128, 64, (16, 16), True, True), (64, 128, (32, 8), True, True),
                         (32, 64, (8, 16), True, True), (64, 128, (16, 16), None, False, True),
                         (64, 128, (16, 16), None, True, True),
                         (64, 64, (16, 16), None, True, True)],
    ("fa2-atomic", 128): [(64, 64, (16, 16), False, True), (64, 64, (16, 16), True, False),
                          (64, 64, (16, 16), True, True), (32, 64, (8, 16), True, True),
                          (64, 32, (16, 16), True, True), (64, 64, (16, 16), None, False, True),
                          (64, 64, (16, 16), None, True, True),
                          (32, 64, (8, 16), None, True, True)],
}


def _launch_forward(cfg, q, k, v, causal=False, kernel="tiled"):
    bm, bn, threads, *options = cfg
    bh, nq, d = q.shape
    kern, tpb = FORWARD_MODULES[kernel].make_forward_kernel(bm, bn, d, causal, q.dtype, threads,
                                                            *options)
    out = arrays.empty_device(q.shape, q.dtype)
    lse = arrays.empty_device((bh, nq), q.dtype)
    kern[(ceil_div(nq, bm), *head_grid(bh)), tpb](q, k, v, out, lse, q.dtype.type(1 / np.sqrt(d)), 1, 1)
    return out, lse


def _launch_backward(cfg, dout, q, k, v, out, lse, causal=False, kernel="tiled"):
    bm, bn, threads, *options = cfg
    extra = dict(zip(("vector_atomics", "prefetch", "tensor_cores"), options))
    dq = arrays.empty_device(q.shape, q.dtype)
    dk = arrays.empty_device(k.shape, k.dtype)
    dv = arrays.empty_device(v.shape, v.dtype)
    BACKWARD_RUNS[kernel](dout, q, k, v, lse, out, dq, dk, dv,
                         scale=1 / np.sqrt(q.shape[2]), heads=1, group=1,
                         causal=causal, block_m=bm, block_n=bn, threads=threads, **extra)
    return dq, dk, dv


def _correct(cfg, d, which, kernel):
    from numba import cuda
    case = Case("tune", 1, 2, 2, 77, 93, d, causal=True)
    q, k, v, dout = case.inputs(np.float32)
    dev = [cuda.to_device(x.reshape(2, x.shape[2], d)) for x in (q, k, v, dout)]
    out, lse = _launch_forward(cfg if which == "fwd" else (32, 32, None), *dev[:3], causal=True,
                               kernel=kernel if which == "fwd" else "tiled")
    if which == "fwd":
        comps = check_forward(q, k, v, out.copy_to_host().reshape(q.shape),
                              lse.copy_to_host().reshape(q.shape[:-1]), causal=True)
    else:
        grads = _launch_backward(cfg, dev[3], *dev[:3], out, lse, causal=True, kernel=kernel)
        comps = check_backward(dout, q, k, v, *(g.copy_to_host().reshape(x.shape)
                                                for g, x in zip(grads, (q, k, v))), causal=True)
    return all(c.ok for c in comps)


def main(n=2048, forward=("tiled", "fa2"), backward=("tiled", "fa2", "fa2-atomic")):
    """Print one line per configuration: forward kernels named in `forward`, then the backward
    kernels named in `backward`."""
    from numba import cuda
    print(f"numba-flash tune: forward {', '.join(forward)}, backward {', '.join(backward)} "
          f"at N={n}, B*N=16k, H=2048/d, float32")
    print(f"{'kernel':<9} {'d':>4} {'block_m':>7} {'block_n':>7} {'TYxTX':>7} {'ok':>3} "
          f"{'ms':>8} {'TFLOP/s':>8}")
    rng = np.random.default_rng(0)
    for d in (64, 128):
        bh = (16384 // n) * (2048 // d)
        q, k, v, dout = (cuda.to_device(rng.standard_normal((bh, n, d), dtype=np.float32))
                         for _ in range(4))
        flops = ref.forward_flops(n, n, d, False, bh)
        jobs = [("fwd", name, FORWARD_CONFIGS[name, d]) for name in forward]
        jobs += [("bwd", name, BACKWARD_CONFIGS[name, d]) for name in backward]
        for which, name, configs in jobs:
            if which == "bwd":
                out, lse = _launch_forward((32, 32, None) if d == 128 else (32, 64, None), q, k, v)
            for cfg in configs:
                try:
                    ok = _correct(cfg, d, which, name)
                    if which == "fwd":
                        ms = median_ms(lambda: _launch_forward(cfg, q, k, v, kernel=name))
                        tf = flops / ms / 1e9
                    else:
                        ms = median_ms(lambda: _launch_backward(cfg, dout, q, k, v, out, lse,
                                                                 kernel=name))
                        tf = 2.5 * flops / ms / 1e9
                    print(f"{which + ' ' + name:<9} {d:>4} {cfg[0]:>7} {cfg[1]:>7} {'%dx%d' % cfg[2]:>7} "
                          f"{'yes' if ok else 'NO':>3} {ms:>8.2f} {tf:>8.1f} {cfg[3:] or ''}", flush=True)
                except Exception as exc:
                    print(f"{which + ' ' + name:<9} {d:>4} {cfg}: {type(exc).__name__}: {str(exc)[:100]}")
    return 0
