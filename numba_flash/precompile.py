"""Compile kernel pairs ahead, in parallel processes, into the disk cache (kernels/cache.py).

Numba compiles one kernel at a time in a process (a process-wide lock), and a Hopper kernel
takes about 5 s to compile: a cold `numba-flash verify` on the H200 spent some 95 of its 98 s
compiling its kernels one after another (2026-12-02). `precompile` runs a tiny forward and
backward of each configuration in worker processes, which compile the kernels and store them
in the disk cache; the caller's own calls then load them (a cache hit: milliseconds).

Only worth it on a GPU with the cache on (`cache.enabled()`); on the simulator nothing is
compiled ahead and nothing is cached.
"""

import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed


def _compile(kernel, d, causal, dtype):
    """In a worker: the API's forward and backward on a (1, 1, 8, d) problem, which compiles
    (or loads) every kernel the pair runs for (d, causal, dtype), and for a causal 16-bit
    dtype a forward long enough for forward16's round-the-heads kernels. Returns the seconds
    taken."""
    import warnings

    import numpy as np
    from numba.core.errors import NumbaPerformanceWarning

    from . import flash_attention_backward, flash_attention_forward
    # a grid of one block is the point here, not a problem worth printing
    warnings.simplefilter("ignore", NumbaPerformanceWarning)
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((1, 1, 8, d)).astype(dtype) for _ in range(4))
    out, lse = flash_attention_forward(q, k, v, causal=causal, kernel=kernel)
    flash_attention_backward(dout, q, k, v, out, lse, causal=causal, kernel=kernel)
    from .kernels.support import SIMULATOR
    if causal and dtype in ("float16", "bfloat16") and not SIMULATOR:
        # the 16-bit causal forward's kernels round the heads, from ROUND_HEADS_FROM query
        # blocks a head (sm90.forward16): a forward that long compiles them too
        from .kernels.sm90 import forward16
        n = forward16.ROUND_HEADS_FROM * forward16.tiles(d)[0]
        q, k, v = (rng.standard_normal((1, 1, n, d)).astype(dtype) for _ in range(3))
        flash_attention_forward(q, k, v, causal=causal, kernel=kernel)
    return time.perf_counter() - t0


def precompile(configs, processes=None, progress=False):
    """Compile the kernels of `configs`, an iterable of (kernel, d, causal, dtype) with kernel
    a registered pair name (as the API takes it) and dtype a name the API takes ("float32",
    "bfloat16", ...), in up to
    `processes` worker processes (default: one per core, at most one per configuration).

    Returns {config: seconds} for those compiled and {config: error text} for those that
    could not be (a pair registered only in the caller's process, say): those compile in the
    caller's process when it first runs them, as they would have without precompile.
    progress: a tqdm bar on stderr."""
    from tqdm import tqdm
    configs = sorted(set((str(k), int(d), bool(c), str(dt)) for k, d, c, dt in configs))
    done, failed = {}, {}
    if not configs:
        return done, failed
    processes = processes or min(len(configs), os.cpu_count() or 1)
    # spawn: a fresh interpreter per worker (fork would copy the caller's CUDA context)
    with ProcessPoolExecutor(max_workers=processes,
                             mp_context=multiprocessing.get_context("spawn")) as pool, \
            tqdm(total=len(configs), unit="config", file=sys.stderr, leave=False,
                 disable=not progress, desc="compiling") as bar:
        futures = {pool.submit(_compile, *c): c for c in configs}
        for future in as_completed(futures):
            config = futures[future]
            try:
                done[config] = future.result()
            except Exception as e:          # noqa: BLE001 - reported to the caller
                failed[config] = f"{type(e).__name__}: {e}"
            bar.update(1)
    return done, failed
