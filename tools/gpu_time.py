"""GPU time a call of a numba-flash pair beside a torch SDPA backend on the same inputs, host
time left out: torch.profiler's device activity of `reps` calls (every kernel a call launches,
summed) divided by reps. The bench (`numba-flash bench`) times synchronized calls, so it pays
each call's host work as well; at N = 1k that host work is a third to a half of a call on the
H200's machine and swings ±30 % between processes (docs/performance.md, 2026-12-04), which
hides kernel changes of a few percent. This shows them.

    python tools/gpu_time.py                                          # wgmma16 vs FA2, bf16, forward
    python tools/gpu_time.py --dtype float32 --kernel wgmma --peer efficient --n 4096
    python tools/gpu_time.py --mode fwd+bwd --json out.json
    python tools/gpu_time.py --d 128 --n 1024 --json new.json         # one head dim
    python tools/gpu_time.py --compare base.json new.json             # A/B of two trees' runs
    python tools/gpu_time.py --mode fwd+bwd --deterministic ...       # the backward without
                                                                      # atomics (its dQ pass)

The grid is the benchmark's (B = 16384 / N, H = 2048 / d), d 64 and 128, causal off and on;
TFLOP/s counted as the bench counts them (forward 4 B H N^2 d, halved under causal masking,
forward+backward 3.5x).

--compare BASE NEW: no GPU; the rows of two --json files (each tree run in its own process,
the peer beside it in both) side by side: ms a call, NEW's speed-up over BASE, the peer's ms in
each process (its drift between the processes is the noise floor of the A/B) and the peer's
time over NEW's (>= 1: at least the peer). Each file records the GPU and the time it was run
on; the table names them and says so where the two files' GPUs differ (an H100 and an H200
do not compare).
"""

import argparse
import datetime
import json


def device_ms(f, reps):
    """Milliseconds of device activity a call of f, after two warm calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    f()
    f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            f()
        torch.cuda.synchronize()
    us = sum(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
             for e in prof.key_averages())
    return us / reps / 1e3


def compare(base, new):
    """The A/B table of two --json results (dicts with "rows"), as lines; rows are matched by
    (d, N, causal, mode), those in only one file are left out."""
    key = lambda r: (r["d"], r["N"], r["causal"], r["mode"])     # noqa: E731
    old = {key(r): r for r in base["rows"]}
    gpus = [run.get("device", "GPU not recorded") for run in (base, new)]
    lines = [f"base: {gpus[0]}, {base.get('date', '?')}; new: {gpus[1]}, {new.get('date', '?')}"]
    if gpus[0] != gpus[1]:
        lines.append("WARNING: the two runs were on different GPUs; their times do not compare")
    paths = [run.get("deterministic", False) for run in (base, new)]
    if paths[0] != paths[1]:
        lines.append("WARNING: one run is deterministic=True, the other not; their backwards "
                     "are different kernels")
    mode = (new["rows"][0]["mode"] if new["rows"] else "") + (" deterministic" if paths[1] else "")
    lines.append(f"{base.get('kernel', '?')} {mode}: "
                 f"d N causal | base ms -> new ms (speed-up) | peer ms base / new | peer / new")
    for r in new["rows"]:
        b = old.get(key(r))
        if b is None:
            continue
        lines.append(f"{r['d']:4d} {r['N']:6d} {r['causal']!s:5s} | {b['ours_ms']:.3f} -> "
                     f"{r['ours_ms']:.3f} ({b['ours_ms'] / r['ours_ms']:.3f}x) | "
                     f"{b['peer_ms']:.3f} / {r['peer_ms']:.3f} | "
                     f"{r['peer_ms'] / r['ours_ms']:.2f}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="wgmma16", help="a registered pair (default wgmma16)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--peer", default="flash", choices=("flash", "efficient", "cudnn"),
                    help="torch SDPA backend beside it (flash: FlashAttention-2; half only)")
    ap.add_argument("--mode", default="fwd", choices=("fwd", "fwd+bwd"))
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128], choices=(64, 128),
                    help="head dims (default both)")
    ap.add_argument("--deterministic", action="store_true",
                    help="fwd+bwd: the backward with deterministic=True (no dQ atomics; where the "
                         "pair has a dQ pass, that pass)")
    ap.add_argument("--json", help="write the rows here (after each one)")
    ap.add_argument("--compare", nargs=2, metavar=("BASE", "NEW"),
                    help="print the A/B table of two --json files and exit (no GPU)")
    args = ap.parse_args(argv)
    if args.deterministic and args.mode != "fwd+bwd":
        ap.error("--deterministic needs --mode fwd+bwd")
    if args.compare:
        base, new = (json.load(open(path)) for path in args.compare)
        print("\n".join(compare(base, new)))
        return
    from numba_flash._gpu import require_gpu  # (first: numba_flash picks GPU or simulator)
    require_gpu("tools/gpu_time.py")

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from numba_flash import flash_attention_backward, flash_attention_forward

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION}[args.peer]
    dt, backward = getattr(torch, args.dtype), args.mode == "fwd+bwd"
    rows, gpu = [], torch.cuda.get_device_name()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    det = " deterministic" if args.deterministic else ""
    print(f"{args.kernel} beside torch {args.peer}, {args.dtype}, {args.mode}{det}, on {gpu}, "
          f"{date}: GPU ms a call (TFLOP/s)")

    def write(complete):
        """The rows so far into --json (after each row); complete: every row of the grid is in
        (tree_ab then takes the file even if the process dies at exit: History 12-07 22:45)."""
        with open(args.json, "w") as f:
            json.dump(dict(kernel=args.kernel, peer=args.peer, device=gpu, date=date,
                           deterministic=args.deterministic, rows=rows, complete=complete), f,
                      indent=1)

    for d in args.d:
        for n in args.n:
            for causal in (False, True):
                b, h = max(1, 16384 // n), max(1, 2048 // d)
                q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=dt)
                               for _ in range(4))
                flops = 4 * b * h * n * n * d / (2 if causal else 1) * (3.5 if backward else 1)

                def ours():
                    o, lse = flash_attention_forward(q, k, v, causal=causal, kernel=args.kernel)
                    if backward:
                        flash_attention_backward(do, q, k, v, o, lse, causal=causal,
                                                 kernel=args.kernel,
                                                 deterministic=args.deterministic)

                qg, kg, vg = (x.detach().requires_grad_(backward) for x in (q, k, v))

                def theirs():
                    with sdpa_kernel(backend):
                        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                        if backward:    # the gradients returned, not added into .grad
                            torch.autograd.grad(o, (qg, kg, vg), do)

                reps = max(3, 20 * 1024 // n)
                r = dict(d=d, N=n, causal=causal, dtype=args.dtype, mode=args.mode)
                for name, f in (("ours", ours), ("peer", theirs)):
                    r[name + "_ms"] = device_ms(f, reps)
                    r[name + "_tflops"] = flops / r[name + "_ms"] / 1e9
                rows.append(r)
                print(f"d={d:3d} N={n:6d} causal={causal!s:5s} {args.kernel} {r['ours_ms']:.3f} "
                      f"({r['ours_tflops']:.1f})  {args.peer} {r['peer_ms']:.3f} "
                      f"({r['peer_tflops']:.1f})  ratio {r['peer_ms'] / r['ours_ms']:.2f}",
                      flush=True)
                if args.json:
                    write(False)
    if args.json:
        write(True)


if __name__ == "__main__":
    main()
