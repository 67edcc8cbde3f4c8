"""A/B timing of registered kernel pairs on the GPU: two (or more) pairs in one process, on
the same inputs, in interleaved rounds (at each grid point, --rounds rounds, each timing every
pair in turn), each figure the median of calls bracketed by CUDA synchronisation
(bench.median_ms):

    python tools/ab.py fa2 wgmma                         # d 64 128, N 1k..8k, causal off, on
    python tools/ab.py wgmma mine --import my_variant.py --d 128 --n 2048 --rounds 3
    python tools/ab.py fa2 wgmma --check --rounds 0      # the tolerance check only
    python tools/ab.py fa2 wgmma --d 16 --n 64 --b 1 --h 1 --rounds 1 --check   # simulator

NAME ...: registered pairs (numba_flash.registry.PAIRS, or "auto"); --import MODULE (a module
name or a .py path, repeatable) is imported first, for a variant it registers
(registry.register(registry.variant("mine", "wgmma", make_forward=...))).

Reported, in TFLOP/s, per (d, N, causal): forward and forward+backward (dQ by atomics where the
pair adds it so), and with --deterministic the forward+backward with deterministic=True; then
each pair's ratio to the first. FLOPs: forward 4 B H (visible pairs) d (reference.
forward_flops: causal counts the visible (query, key) pairs), forward+backward 3.5x that.
Grid: the benchmark's, B = 16384 / N, H = 2048 / d (--b, --h override: tiny sizes for the
simulator), float32. A pair that cannot run a point on this device is shown "-" (no
fallback to another pair).

--check: before timing, each pair's forward and backward (and deterministic backward with
--deterministic) against truth within the tolerance rule (numba_flash.testing.check_forward,
check_backward) on one odd case per d (B 1, H 2 over Hk 1 (GQA), Nq = N - 1, Nk = N at the
smallest --n, causal); exit 1 without timing if any is outside it.
"""

import argparse
import dataclasses
import importlib
import runpy
import sys

import numpy as np

import reference as ref
from numba_flash import flash_attention_backward, flash_attention_forward, registry
from numba_flash.bench import free_caches, make_inputs, median_ms
from numba_flash.testing import Case, check_backward, check_forward


def _calls(name, q, k, v, dout, causal):
    """name's forward, forward+backward and deterministic forward+backward, as thunks."""
    def fwd():
        return flash_attention_forward(q, k, v, causal=causal, kernel=name)

    def fwd_bwd(deterministic=False):
        out, lse = flash_attention_forward(q, k, v, causal=causal, kernel=name)
        return flash_attention_backward(dout, q, k, v, out, lse, causal=causal,
                                        deterministic=deterministic, kernel=name)
    return {"fwd": fwd, "fwd+bwd": fwd_bwd, "fwd+bwd det": lambda: fwd_bwd(True)}


def _runs(name, d, device):
    """Whether `name` runs head dim d in float32 here as itself (not through a fallback)."""
    if name == "auto":
        return True
    return registry.PAIRS[name].can_run(d, np.float32, device)


def check(names, head_dims, n, deterministic, device):
    """Each pair against truth on one odd case per d; the number of comparisons outside."""
    bad = 0
    for d in head_dims:
        case = Case("check", 1, 2, 1, max(1, n - 1), n, d, causal=True)
        q, k, v, dout = case.inputs(np.float32)
        for name in names:
            if not _runs(name, d, device):
                print(f"check {name} {case}: skipped (cannot run d={d} float32 on {device})")
                continue
            out, lse = flash_attention_forward(q, k, v, causal=True, kernel=name)
            results = check_forward(q, k, v, out, lse, causal=True)
            for det in (False, True) if deterministic else (False,):
                grads = flash_attention_backward(dout, q, k, v, out, lse, causal=True,
                                                 deterministic=det, kernel=name)
                results += [dataclasses.replace(c, name=f"{c.name}{' (deterministic)' * det}")
                            for c in check_backward(dout, q, k, v, *grads, causal=True)]
            for c in results:
                bad += not c.ok
                print(f"check {name} {case}: {c}", flush=True)
    return bad


def time_grid(names, grid, rounds, deterministic, device, b=None, h=None):
    """{(d, n, causal, mode, name): [TFLOP/s per round]}, printing each figure as it comes."""
    modes = ("fwd", "fwd+bwd") + (("fwd+bwd det",) if deterministic else ())
    figures = {}
    for d, n, causal in grid:
        bb, hh = b or max(1, 16384 // n), h or 2048 // d
        free_caches()
        q, k, v, dout = make_inputs(bb, hh, n, d)
        flops = ref.forward_flops(n, n, d, causal, bb * hh)
        for rnd in range(rounds):
            for name in names:
                if not _runs(name, d, device):
                    continue
                calls = _calls(name, q, k, v, dout, causal)
                line = []
                for mode in modes:
                    ms = median_ms(calls[mode])
                    tflops = flops * (1 if mode == "fwd" else 3.5) / ms / 1e9
                    figures.setdefault((d, n, causal, mode, name), []).append(tflops)
                    line.append(f"{mode} {tflops:.3g}")
                print(f"d={d} N={n} causal={causal} B={bb} H={hh} round {rnd} {name}: "
                      f"{', '.join(line)} TFLOP/s", flush=True)
        del q, k, v, dout
    return figures


def table(names, grid, figures, deterministic):
    """Per mode: one line per (d, N, causal), the median over rounds of each pair's TFLOP/s,
    then each pair's ratio to the first."""
    modes = ("fwd", "fwd+bwd") + (("fwd+bwd det",) if deterministic else ())
    titles = {"fwd": "forward", "fwd+bwd": "forward+backward",
              "fwd+bwd det": "forward+backward, deterministic backward"}
    w = max(10, *(len(n) for n in names))
    lines = []
    for mode in modes:
        lines.append(f"\n{titles[mode]} TFLOP/s (median of rounds)")
        lines.append(f"{'d':>4} {'N':>6} {'causal':>6} " + " ".join(f"{n:>{w}}" for n in names)
                     + "".join(f" {n + '/' + names[0]:>{w + len(names[0]) + 1}}"
                               for n in names[1:]))
        for d, n, causal in grid:
            med = {name: float(np.median(figures[(d, n, causal, mode, name)]))
                   for name in names if (d, n, causal, mode, name) in figures}
            cells = [f"{med[name]:>{w}.3g}" if name in med else f"{'-':>{w}}" for name in names]
            ratios = [f" {med[name] / med[names[0]]:>{w + len(names[0]) + 1}.3f}"
                      if name in med and names[0] in med else
                      f" {'-':>{w + len(names[0]) + 1}}" for name in names[1:]]
            lines.append(f"{d:>4} {n:>6} {str(causal):>6} " + " ".join(cells) + "".join(ratios))
    return "\n".join(lines)


def _import(what):
    if what.endswith(".py"):
        runpy.run_path(what, run_name="__ab_import__")
    else:
        importlib.import_module(what)


def main(argv=None):
    p = argparse.ArgumentParser(prog="tools/ab.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="+", metavar="NAME", help="registered pairs (or auto)")
    p.add_argument("--d", type=int, nargs="+", default=[64, 128], help="head dims")
    p.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096, 8192],
                   help="sequence lengths (Nq = Nk)")
    p.add_argument("--causal", choices=("off", "on", "both"), default="both")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (0: no timing)")
    p.add_argument("--deterministic", action="store_true",
                   help="also time (and check) the deterministic backward")
    p.add_argument("--check", action="store_true",
                   help="check every pair within tolerance first (exit 1 if one is not)")
    p.add_argument("--b", type=int, help="batch (default 16384 / N)")
    p.add_argument("--h", type=int, help="heads (default 2048 / d)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE (or run a .py file) first, to register a variant")
    args = p.parse_args(argv)
    from numba_flash._gpu import require_gpu  # (first: numba_flash picks GPU or simulator)
    require_gpu("tools/ab.py")
    for what in args.imports:
        _import(what)
    args.names = list(dict.fromkeys(args.names))          # each once, in the order given
    unknown = [n for n in args.names if n != "auto" and n not in registry.PAIRS]
    if unknown:
        p.error(f"not registered: {', '.join(unknown)}; registered: "
                f"{', '.join(sorted(registry.PAIRS))} (or auto)")
    device = registry.current_device()
    if device == "simulator":
        print("tools/ab.py: on Numba's CUDA simulator (no GPU): figures mean nothing here",
              file=sys.stderr)
    if args.check:
        bad = check(args.names, args.d, min(args.n), args.deterministic, device)
        print(f"check: {bad} comparisons outside tolerance", flush=True)
        if bad:
            return 1
    if args.rounds <= 0:
        return 0
    causal = dict(off=(False,), on=(True,), both=(False, True))[args.causal]
    grid = [(d, n, c) for d in args.d for n in args.n for c in causal]
    figures = time_grid(args.names, grid, args.rounds, args.deterministic, device,
                        args.b, args.h)
    print(table(args.names, grid, figures, args.deterministic))
    return 0


if __name__ == "__main__":
    sys.exit(main())
