"""`numba-flash bench`: TFLOP/s and peak device memory beside the peers, same process, same inputs.

Grid (FlashAttention's benchmark): batch * seqlen = 16k, hidden 2048 (H = 2048 / d), d in
{64, 128}, N in {512, ..., 16k}, causal off and on, float32 (`--dtype bfloat16` / `float16`
for half inputs). Peers: standard attention in CuPy (S and P materialized, cuBLAS products;
float32 only) and torch scaled_dot_product_attention with the math and efficient backends,
and for half inputs also its flash (FlashAttention-2) and cuDNN backends, when importable. FLOPs: forward 4 * B * H * (visible pairs) * d,
forward+backward 3.5x that. Times are medians over repeats, each bracketed by device syncs.
Ours: every registered kernel pair, forward and forward+backward ("numba-flash NAME"), and
"numba-flash auto", what the API runs by default. `--d`, `--n` and `--impl` (fnmatch
patterns on those names) pick a part of the grid and of the implementations.
"""

import datetime
import fnmatch
import json
import math
import platform
import time

import numpy as np

import reference as ref

from . import arrays
from .api import flash_attention_backward, flash_attention_forward
from .registry import PAIRS

DTYPES = ("float32", "bfloat16", "float16")        # what --dtype takes
QUICK_GRID = [(d, n, c) for d in (64, 128) for n in (512, 1024) for c in (False, True)]
FULL_GRID = [(d, n, c) for d in (64, 128) for n in (512, 1024, 2048, 4096, 8192, 16384)
             for c in (False, True)]


def _sync():
    from numba import cuda
    cuda.synchronize()


def median_ms(fn, min_seconds=0.3, max_reps=100, warmup_seconds=0.1):
    """Median wall time of fn() in ms, each call bracketed by device synchronization.
    Warm-up calls for warmup_seconds first (compilation, the allocator, and the GPU after
    host work: the fa2 forward at d = 128, N = 1k, timed first in its bench case after one
    warm-up call, ran 24.6 TFLOP/s in the bench and 25.8 in a later script, 28.1-28.5 timed
    again in the same process; 2026-11-29, H200), then calls until min_seconds have passed
    (at least two, at most max_reps)."""
    start = time.perf_counter()
    while True:
        fn()
        _sync()
        if time.perf_counter() - start >= warmup_seconds:
            break
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < 2 or time.perf_counter() - start < min_seconds):
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def _numba_flash(kernel):
    def fwd(q, k, v, causal):
        return flash_attention_forward(q, k, v, causal=causal, kernel=kernel)

    def fwd_bwd(q, k, v, causal, dout):
        out, lse = flash_attention_forward(q, k, v, causal=causal, kernel=kernel)
        return flash_attention_backward(dout, q, k, v, out, lse, causal=causal, kernel=kernel)
    return fwd, fwd_bwd


def _cupy_standard(q, k, v, causal):
    """Standard attention in CuPy: S and P live in device memory (cuBLAS for both products)."""
    import cupy as cp
    q, k, v = (cp.asarray(x) for x in (q, k, v))
    S = cp.matmul(q, k.swapaxes(-1, -2)) * np.float32(1 / math.sqrt(q.shape[-1]))
    if causal:
        n = q.shape[-2]
        S = cp.where(cp.tri(n, n, dtype=bool), S, np.float32(-np.inf))
    S -= S.max(axis=-1, keepdims=True)
    P = cp.exp(S, out=S)
    P /= P.sum(axis=-1, keepdims=True)
    return cp.matmul(P, v)


def _torch_sdpa(backend_name):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend_name]

    def fwd(q, k, v, causal):
        with sdpa_kernel(backend), torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd(q, k, v, causal, dout):
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        out.backward(dout)
        return qg.grad, kg.grad, vg.grad
    return fwd, fwd_bwd


# torch's SDPA backends run beside ours: FlashAttention-2 ("flash") and cuDNN take half
# inputs only
TORCH_BACKENDS = {"float32": ("math", "efficient"),
                  "half": ("math", "efficient", "flash", "cudnn")}


def implementations(dtype="float32"):
    """name -> (forward fn or None, forward+backward fn or None, memory probe kind), for
    inputs of `dtype` ("float32", "float16" or "bfloat16")."""
    impls = {}
    for name in ("auto", *sorted(PAIRS)):       # every registered pair, and the default
        fwd, fwd_bwd = _numba_flash(name)
        impls[f"numba-flash {name}"] = (fwd, fwd_bwd, "device")
    try:
        import cupy  # noqa: F401
        if dtype == "float32":
            impls["cupy standard"] = (_cupy_standard, None, "cupy")
    except ImportError:
        pass
    try:
        import torch
        if torch.cuda.is_available():
            for b in TORCH_BACKENDS["float32" if dtype == "float32" else "half"]:
                f, fb = _torch_sdpa(b)
                impls[f"torch {b}"] = (f, fb, "torch")
    except ImportError:
        pass
    return impls


def _measure_memory(kind, call):
    """Peak extra device bytes of one call, by the allocator that serves it: torch's peak
    statistics, CuPy's pool growth, numba-flash's own allocation count (outputs + D)."""
    if kind == "torch":
        import torch
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        call()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    if kind == "cupy":
        import cupy as cp
        pool = cp.get_default_memory_pool()
        pool.free_all_blocks()
        base = pool.total_bytes()
        call()
        cp.cuda.Device().synchronize()
        return pool.total_bytes() - base       # what the pool had to reserve for the call
    with arrays.AllocationMeter() as meter:   # numba-flash allocates only through arrays
        call()
    return meter.bytes


def make_inputs(b, h, n, d, seed=0, dtype="float32"):
    """q, k, v, dout of `dtype` on the device, as torch tensors when torch is present (shared
    by every implementation through __cuda_array_interface__), else Numba arrays (float32 and
    float16; bfloat16 needs torch)."""
    rng = np.random.default_rng(seed)
    host = [rng.standard_normal((b, h, n, d), dtype=np.float32) for _ in range(4)]
    try:
        import torch
        if torch.cuda.is_available():
            return [torch.from_numpy(x).cuda().to(getattr(torch, dtype)) for x in host]
    except ImportError:
        pass
    if dtype == "bfloat16":
        raise ValueError("the bfloat16 bench needs torch with CUDA (pip install -e .[torch])")
    from numba import cuda
    return [cuda.to_device(x.astype(dtype)) for x in host]


def free_caches():
    try:
        import torch
        torch.cuda.empty_cache()
    except ImportError:
        pass
    try:
        import cupy as cp
        cp.get_default_memory_pool().free_all_blocks()
    except ImportError:
        pass


def run(grid, modes=("fwd", "fwd+bwd"), progress=True, on_record=None, only=None,
        dtype="float32"):
    """Measure every implementation (only: those whose name matches one of these fnmatch
    patterns, e.g. "torch *") on every grid point, inputs of `dtype`; return a list of
    records. on_record(records) is called after each one (the CLI saves the JSON file as it
    goes)."""
    from tqdm import tqdm
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    impls = {name: impl for name, impl in implementations(dtype).items()
             if not only or any(fnmatch.fnmatchcase(name, pattern) for pattern in only)}
    if not impls:
        raise ValueError(f"no implementation matches {only}; there are "
                         f"{sorted(implementations(dtype))}")
    records = []
    jobs = [(d, n, c, mode, name) for d, n, c in grid for mode in modes for name in impls
            if impls[name][0 if mode == "fwd" else 1] is not None]
    bar = tqdm(jobs, disable=not progress, desc="bench", unit="case")
    inputs_key, inputs = None, None
    for d, n, causal, mode, name in bar:
        b, h = max(1, 16384 // n), 2048 // d
        if inputs_key != (b, h, n, d):
            inputs, inputs_key = None, (b, h, n, d)
            free_caches()
            inputs = make_inputs(b, h, n, d, dtype=dtype)
        q, k, v, dout = inputs
        fwd, fwd_bwd, mem_kind = impls[name]
        call = (lambda: fwd(q, k, v, causal)) if mode == "fwd" else (
            lambda: fwd_bwd(q, k, v, causal, dout))
        flops = ref.forward_flops(n, n, d, causal, b * h) * (1 if mode == "fwd" else 3.5)
        rec = dict(impl=name, mode=mode, d=d, N=n, B=b, H=h, causal=causal, dtype=dtype,
                   flops=flops)
        bar.set_postfix_str(f"{name} {mode} d{d} N{n}{' causal' if causal else ''}")
        try:
            rec["ms"] = median_ms(call)
            rec["tflops"] = flops / rec["ms"] / 1e9
            free_caches()
            rec["peak_bytes"] = int(_measure_memory(mem_kind, call))
        except Exception as exc:  # out of memory, unsupported shape: recorded, not fatal
            rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            free_caches()
        records.append(rec)
        if on_record:
            on_record(records)
    return records


def run_long(n=131072, b=1, h=16, d=128):
    """Forward + backward at long context, where the N x N matrices alone would need
    B*H*N^2*4 bytes (about 1.1 TB at N = 131072): one timed call, and its peak memory."""
    q, k, v, dout = make_inputs(b, h, n, d)
    fwd, fwd_bwd = _numba_flash("auto")
    small = make_inputs(b, h, 1024, d)
    fwd_bwd(small[0], small[1], small[2], False, small[3])                      # compile
    with arrays.AllocationMeter() as meter:
        t0 = time.perf_counter()
        dq, dk, dv = fwd_bwd(q, k, v, False, dout)
        _sync()
        seconds = time.perf_counter() - t0
    flops = ref.forward_flops(n, n, d, False, b * h) * 3.5
    finite = all(bool(np.isfinite(np.asarray(g.cpu() if hasattr(g, "cpu") else g.copy_to_host())).all())
                 for g in (dq, dk, dv))
    return dict(impl="numba-flash auto", mode="fwd+bwd", d=d, N=n, B=b, H=h,
                causal=False, dtype="float32", flops=flops, ms=seconds * 1e3, tflops=flops / seconds / 1e12,
                peak_bytes=int(meter.bytes), nxn_bytes=b * h * n * n * 4, finite=finite)


def environment():
    import numba
    from numba import cuda
    env = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               python=platform.python_version(), numpy=np.__version__, numba=numba.__version__)
    dev = cuda.get_current_device()
    env["gpu"] = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    try:
        import numba_cuda
        env["numba_cuda"] = numba_cuda.__version__
    except (ImportError, AttributeError):
        pass
    for mod in ("torch", "cupy"):
        try:
            env[mod] = __import__(mod).__version__
        except ImportError:
            pass
    return env


def table(records):
    """Text table: one line per (mode, d, causal, N), TFLOP/s per implementation."""
    impls = sorted({r["impl"] for r in records})
    lines = []
    for mode in ("fwd", "fwd+bwd"):
        rows = [r for r in records if r["mode"] == mode]
        if not rows:
            continue
        names = [i for i in impls if any(r["impl"] == i for r in rows)]
        lines.append(f"\n{mode} TFLOP/s (peak extra GB at the largest N)")
        widths = [max(20, len(n)) for n in names]
        lines.append(f"{'d':>4} {'causal':>6} {'N':>6} " + " ".join(f"{n:>{w}}" for n, w in
                                                                 zip(names, widths)))
        keys = sorted({(r["d"], r["causal"], r["N"]) for r in rows})
        for d, c, n in keys:
            cells = []
            for name in names:
                r = next((r for r in rows if (r["impl"], r["d"], r["causal"], r["N"]) ==
                          (name, d, c, n)), None)
                if r is None:
                    cells.append("-")
                elif "error" in r:
                    cells.append(r["error"].split(":")[0][:20])
                else:
                    cells.append(f"{r['tflops']:.1f} ({r['peak_bytes'] / 1e9:.2f} GB)")
            lines.append(f"{d:>4} {str(c):>6} {n:>6} " + " ".join(f"{x:>{w}}" for x, w in
                                                                   zip(cells, widths)))
    return "\n".join(lines)


def ratios(records):
    """Text: for each numba-flash implementation and each other one (the peers), per mode, the
    range of ours / peer TFLOP/s over the grid points both ran and the point where ours is
    furthest behind (issue targets are ratios "at every point"), e.g.
    `fwd+bwd numba-flash wgmma / torch efficient: 1.42-1.51x, lowest d=64 N=1024 causal`."""
    ok = [r for r in records if "error" not in r]
    tflops = {(r["impl"], r["mode"], r["d"], r["causal"], r["N"]): r["tflops"] for r in ok}
    ours = sorted({r["impl"] for r in ok if r["impl"].startswith("numba-flash")})
    peers = sorted({r["impl"] for r in ok} - set(ours))
    lines = []
    for mode in ("fwd", "fwd+bwd"):
        for name in ours:
            for peer in peers:
                points = {key[2:]: value / tflops[(peer, *key[1:])]
                          for key, value in tflops.items()
                          if key[:2] == (name, mode) and (peer, *key[1:]) in tflops}
                if not points:
                    continue
                (d, causal, n), low = min(points.items(), key=lambda item: item[1])
                lines.append(f"{mode} {name} / {peer}: {low:.2f}-{max(points.values()):.2f}x "
                             f"over {len(points)} points, lowest d={d} N={n}"
                             f"{' causal' if causal else ''}")
    return "\n".join(lines)


def select_grid(grid, head_dims=None, lengths=None):
    """The points of grid with d in head_dims and N in lengths (None: any); ValueError when
    that leaves none."""
    points = [(d, n, c) for d, n, c in grid
              if (not head_dims or d in head_dims) and (not lengths or n in lengths)]
    if not points:
        raise ValueError(f"no grid point has d in {head_dims} and N in {lengths}; the grid "
                         f"has d {sorted({p[0] for p in grid})}, N {sorted({p[1] for p in grid})}")
    return points


def main(json_path, quick=False, mode="both", long=False, head_dims=None, lengths=None,
         impls=None, dtype="float32"):
    """The CLI's bench: the full grid (quick: QUICK_GRID), or the points with d in head_dims
    and N in lengths; implementations whose name matches one of the fnmatch patterns `impls`
    (None: all)."""
    modes = ("fwd", "fwd+bwd") if mode == "both" else (mode,)
    grid = select_grid(QUICK_GRID if quick else FULL_GRID, head_dims, lengths)
    env = environment()
    print(f"numba-flash bench on {env['gpu']}: {env}")
    def save(records):
        with open(json_path, "w") as f:
            json.dump(dict(environment=env, records=records), f, indent=1)
    records = run(grid, modes, on_record=save, only=impls, dtype=dtype)
    if long:
        records.append(run_long())
        save(records)
    print(table(records))
    if ratios(records):
        print("\nours / peers (TFLOP/s):\n" + ratios(records))
    for r in records:
        if r["N"] > 16384:
            print(f"\nlong context: {r['impl']} {r['mode']} B{r['B']} H{r['H']} N{r['N']} d{r['d']}: "
                  f"{r['ms'] / 1e3:.1f} s, {r['tflops']:.1f} TFLOP/s, peak extra "
                  f"{r['peak_bytes'] / 1e9:.2f} GB (N x N would be {r['nxn_bytes'] / 1e12:.2f} TB), "
                  f"finite gradients: {r['finite']}")
    print(f"\nall figures: {json_path}")
    return 0
