"""Where the time of one API call goes, on a GPU: the kernels' own times (torch.profiler's CUDA
activity, which sees Numba's launches too), the host's time a call (no synchronization inside
the timed loop, so a call's host work is measured, not the GPU's), and the host pieces it is
made of (array imports, allocation, a registry launch); --profile adds cProfile's top entries.
A synchronized call (numba-flash bench's) pays host time and kernel time in turn: where the
host part is comparable to the kernels' (N = 1k on an H200, 2026-12-04: 0.4-0.5 ms host per
forward against 0.66 ms of kernel), it sets the figure.

    python tools/call_time.py                                  # wgmma16, bfloat16, d 64, N 1k
    python tools/call_time.py --kernel wgmma --dtype float32 --d 128 --n 4096 --profile

Inputs are torch tensors on the GPU (the benchmark's grid: B = 16384 / N, H = 2048 / d).
"""

import argparse
import cProfile
import io
import pstats
import time

import numpy as np


def per_call_us(f, reps):
    """Host microseconds a call of f, after one warm call; the GPU is synchronized only
    around the loop."""
    import torch
    f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    dt = (time.perf_counter() - t) / reps * 1e6
    torch.cuda.synchronize()
    return dt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="wgmma16")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--reps", type=int, default=50, help="calls per host timing")
    ap.add_argument("--profile", action="store_true", help="cProfile of 20 calls: top 25 by own time, top 40 by cumulative")
    args = ap.parse_args(argv)
    from numba_flash._gpu import require_gpu  # (first: numba_flash picks GPU or simulator)
    require_gpu("tools/call_time.py")

    import torch
    from torch.profiler import ProfilerActivity, profile

    from numba_flash import arrays, flash_attention_backward, flash_attention_forward

    d, n = args.d, args.n
    b, h = max(1, 16384 // n), max(1, 2048 // d)
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=getattr(torch, args.dtype))
                   for _ in range(4))
    kw = dict(causal=args.causal, kernel=args.kernel)
    out, lse = flash_attention_forward(q, k, v, **kw)

    def fwd():
        return flash_attention_forward(q, k, v, **kw)

    def bwd():
        return flash_attention_backward(do, q, k, v, out, lse, **kw)

    print(f"{args.kernel} {args.dtype} d={d} N={n} B={b} H={h} causal={args.causal} "
          f"on {torch.cuda.get_device_name()}")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fwd()
            bwd()
        torch.cuda.synchronize()
    print("kernels, 5 forward + backward calls:")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10,
                                    max_name_column_width=70))
    shape = (b * h, n, d)
    print("host us a call:")
    for name, f in (
            ("torch.empty", lambda: torch.empty(shape, dtype=q.dtype, device="cuda")),
            ("__cuda_array_interface__",
             lambda: q.view(torch.int16).__cuda_array_interface__ if q.dtype == torch.bfloat16
             else q.__cuda_array_interface__),
            ("arrays.to_device", lambda: arrays.to_device(q, shape, 0)),
            ("arrays.empty_device", lambda: arrays.empty_device(shape, np.float32, like=q)),
            ("API forward", fwd),
            ("API backward", bwd)):
        print(f"  {name:28s} {per_call_us(f, args.reps):9.1f}")
    if args.profile:
        for name, f in (("forward", fwd), ("backward", bwd)):
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(20):
                f()
                torch.cuda.synchronize()
            pr.disable()
            text = io.StringIO()
            stats = pstats.Stats(pr, stream=text)
            stats.sort_stats("tottime").print_stats(25)
            stats.sort_stats("cumulative").print_stats(40)
            print(f"cProfile, 20 synchronized {name} calls, by own time, then by cumulative "
                  f"time:\n{text.getvalue()}")


if __name__ == "__main__":
    main()
