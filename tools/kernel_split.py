"""Where a forward+backward's GPU time goes, kernel by kernel, under Nsight Compute.

Run a float32 forward and backward twice (FlashAttention's grid: hidden 2048, batch.N = 16k,
torch tensors) under ncu, then sum its CSV per kernel for the second (warm) call:

    ncu --metrics gpu__time_duration.sum --csv python tools/kernel_split.py run \
        --n 4096 --d 64 [--causal] [--deterministic] > split.csv
    python tools/kernel_split.py summarize split.csv [more.csv ...]

ncu locks the clocks, so the milliseconds are longer than a bench's; compare them with each
other (e.g. the dQ pass against the dK/dV kernel, or two trees), not with a bench.
"""
import argparse
import csv


def run(n, d, causal, deterministic):
    """Two forward+backward calls of the auto pair on (16384 / n, 2048 / d, n, d) inputs."""
    import torch

    import numba_flash as nf
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(16384 // n, 2048 // d, n, d, device="cuda", generator=g)
                     for _ in range(4))
    for _ in range(2):
        out, lse = nf.flash_attention_forward(q, k, v, causal=causal)
        dq, dk, dv = nf.flash_attention_backward(dout, q, k, v, out, lse, causal=causal,
                                                 deterministic=deterministic)
    torch.cuda.synchronize()
    print("ok", tuple(dq.shape), float(dq.abs().sum()))


def kernel_times(path):
    """[(kernel's short name, ms)] of numba-flash's launches in an ncu CSV, in launch order
    (torch's own kernels, which made the inputs and the check sum, left out)."""
    rows = [r for r in csv.reader(open(path)) if len(r) > 5]
    head, times = rows[0], []
    for r in rows[1:]:
        rec = dict(zip(head, r))
        name = rec["Kernel Name"]
        if name.startswith("void ") or rec["Metric Name"] != "gpu__time_duration.sum":
            continue
        scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0,
                 "msecond": 1.0}[rec["Metric Unit"]]
        short = name.split("[")[0].split("(")[0].split("::")[-1]
        times.append((short, float(rec["Metric Value"].replace(",", "")) * scale))
    return times


def summarize(paths):
    """One line a CSV: the second call's kernels, ms each, and the backward's sum."""
    for path in paths:
        times = kernel_times(path)
        warm = times[len(times) // 2:]
        bwd = sum(ms for name, ms in warm if "forward" not in name)
        print(f"{path}: " + " ".join(f"{name}={ms:.2f}" for name, ms in warm)
              + f" backward={bwd:.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="two forward+backward calls (under ncu)")
    r.add_argument("--n", type=int, default=4096)
    r.add_argument("--d", type=int, default=64)
    r.add_argument("--causal", action="store_true")
    r.add_argument("--deterministic", action="store_true")
    s = sub.add_parser("summarize", help="per-kernel ms of the second call")
    s.add_argument("csv", nargs="+")
    args = parser.parse_args()
    if args.command == "run":
        from numba_flash._gpu import require_gpu
        require_gpu("tools/kernel_split.py run")
        run(args.n, args.d, args.causal, args.deterministic)
    else:
        summarize(args.csv)


if __name__ == "__main__":
    main()
