"""`numba-flash` console script (also `python -m numba_flash`): verify, bench, fuzz, replay,
tune, info."""

import argparse
import sys

import numba_flash
from ._gpu import gpu_missing


def main(argv=None):
    parser = argparse.ArgumentParser(prog="numba-flash", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_verify = sub.add_parser(
        "verify", help="the kernels against the reference (default: what kernel='auto' runs)")
    p_verify.add_argument("--quiet", action="store_true", help="print failing rows only")
    which = p_verify.add_mutually_exclusive_group()
    which.add_argument("--kernel", action="append", dest="kernels", metavar="NAME",
                       help="a registered kernel pair to check, forward and backward "
                            "(repeat for more; default: the pair kernel='auto' runs for each "
                            "case and dtype here)")
    which.add_argument("--all", action="store_true", dest="all_pairs",
                       help="every registered kernel pair")
    p_verify.add_argument("--dtype", action="append", dest="dtypes",
                          choices=("float16", "bfloat16", "float32", "float64"),
                          help="only inputs of this dtype (repeatable; default all four)")
    p_verify.add_argument("--case", action="append", dest="cases", metavar="NAME",
                          help='only the case of this name, e.g. "GQA" (repeatable; default '
                               'all)')
    p_verify.add_argument("--deterministic", action="store_true",
                          help="run every backward with deterministic=True (no dQ atomics)")
    p_bench = sub.add_parser("bench", help="TFLOP/s and peak memory beside the peers")
    p_bench.add_argument("--json", default="bench.json", help="file for every figure")
    p_bench.add_argument("--quick", action="store_true", help="a small grid (a smoke test)")
    p_bench.add_argument("--mode", choices=("fwd", "fwd+bwd", "both"), default="both")
    p_bench.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                         help="the inputs' dtype (half: torch's flash and cuDNN beside)")
    p_bench.add_argument("--d", type=int, nargs="+", metavar="D",
                         help="only these head dims of the grid (64, 128)")
    p_bench.add_argument("--n", type=int, nargs="+", metavar="N",
                         help="only these sequence lengths of the grid (512 ... 16384)")
    p_bench.add_argument("--impl", action="append", metavar="PATTERN",
                         help='only implementations whose name matches PATTERN (fnmatch, e.g. '
                              '"torch *"; repeatable)')
    p_bench.add_argument("--long", action="store_true",
                         help="also forward+backward at N = 131072 (B 1, H 16, d 128, float32)")
    sub.add_parser("info", help="versions, device, registered kernels")
    tune = sub.add_parser("tune", help="time the kernels over tile and thread shapes")
    tune.add_argument("--forward", nargs="*", default=["tiled", "fa2"], metavar="KERNEL",
                      help="forward kernels to tune (tiled, fa2)")
    tune.add_argument("--backward", nargs="*", default=["tiled", "fa2", "fa2-atomic"],
                      metavar="KERNEL",
                      help="backward kernels to tune (tiled, fa2, fa2-atomic; none: forward only)")
    tune.add_argument("--n", type=int, default=2048, help="sequence length (default 2048)")
    p_fuzz = sub.add_parser("fuzz", help="run the properties as a campaign; save failures")
    p_fuzz.add_argument("--profile", choices=("ci", "dev", "gpu", "nightly"), default=None,
                        help="Hypothesis profile (default: dev on the simulator, gpu on a GPU)")
    budget = p_fuzz.add_mutually_exclusive_group()
    budget.add_argument("--examples", type=int, help="examples per (property, kernel)")
    budget.add_argument("--seconds", type=float,
                        help="run for about this long, shared among the (property, kernel) "
                             "pairs (each gets at least one example)")
    p_fuzz.add_argument("--out", default="reproducers", help="folder for reproducer files")
    p_fuzz.add_argument("--property", action="append", dest="properties", metavar="NAME",
                        help="run only this property (repeatable); default all")
    p_fuzz.add_argument("--kernel", action="append", dest="kernels", metavar="NAME",
                        help="run only this registered kernel (repeatable); default all")
    p_fuzz.add_argument("--dtype", action="append", dest="dtypes",
                        choices=("float16", "bfloat16", "float32", "float64"),
                        help="draw only inputs of this dtype (repeatable); default all four")
    p_replay = sub.add_parser("replay", help="re-run one reproducer file and compare")
    p_replay.add_argument("file")
    args = parser.parse_args(argv)

    if args.command == "verify":
        from . import verify
        return verify.main(numba_flash.SIMULATOR, quiet=args.quiet, kernels=args.kernels,
                           all_pairs=args.all_pairs, case_names=args.cases,
                           dtypes=args.dtypes, deterministic=args.deterministic)
    if args.command == "bench":
        if gpu_missing("numba-flash bench"):
            return 2
        from . import bench
        return bench.main(args.json, quick=args.quick, mode=args.mode, long=args.long,
                          head_dims=args.d, lengths=args.n, impls=args.impl, dtype=args.dtype)
    if args.command == "info":
        return info()
    if args.command == "fuzz":
        return fuzz(args)
    if args.command == "replay":
        return replay(args.file)
    if args.command == "tune":
        if gpu_missing("numba-flash tune"):
            return 2
        from . import tune
        return tune.main(n=args.n, forward=tuple(args.forward), backward=tuple(args.backward))
    return 2


def fuzz(args):
    """`numba-flash fuzz`: the campaign (testing.campaign.fuzz), a table of examples and
    failures per (property, kernel) pair, the worst examples and every failure. Returns 0,
    1 when an example failed, 2 for a usage error."""
    from .registry import PAIRS
    from .testing import campaign, profiles
    from .testing.properties import PROPERTIES
    if (args.examples is not None and args.examples < 1) or (
            args.seconds is not None and not args.seconds > 0):
        print("--examples must be at least 1 and --seconds positive", file=sys.stderr)
        return 2
    unknown = set(args.properties or ()) - set(PROPERTIES)
    if unknown:
        print(f"unknown properties {sorted(unknown)}; choose from {sorted(PROPERTIES)}",
              file=sys.stderr)
        return 2
    unknown = set(args.kernels or ()) - set(PAIRS)
    if unknown:
        print(f"unknown kernels {sorted(unknown)}; registered: {sorted(PAIRS)}",
              file=sys.stderr)
        return 2
    todo = campaign.pairs(args.properties, args.kernels)
    if not todo:
        print("no (property, kernel) pair matches; nothing to run", file=sys.stderr)
        return 2
    name, size = profiles.load(args.profile or ("dev" if numba_flash.SIMULATOR else "gpu"),
                               numba_flash.SIMULATOR)
    examples = args.examples
    if examples is None and args.seconds is None:
        from hypothesis import settings
        examples = settings.default.max_examples
    where = "the CUDA simulator" if numba_flash.SIMULATOR else "the GPU"
    print(f"numba-flash fuzz: profile {name} ({size} sizes) on {where}; {len(todo)} "
          f"(property, kernel) pairs, " + (f"{examples} examples each" if examples else
                                          f"{args.seconds:g} s shared among them"))
    outcomes, failures, paths = campaign.fuzz(size, examples, args.seconds, args.out,
                                              properties=args.properties, kernels=args.kernels,
                                              dtypes=tuple(args.dtypes or campaign.DTYPES))
    print(f"\n{len(outcomes)} examples over {len(todo)} (property, kernel) pairs, "
          f"{len(failures)} failed.")
    width = max(len(p) for p, _ in todo) + 2
    kwidth = max(12, max(len(k) for _, k in todo) + 1)
    print(f"{'property':<{width}} {'kernel':<{kwidth}} {'examples':>8} {'failed':>6} "
          f"{'worst err/allowed':>18}")
    for prop, kernel, n, bad, worst in campaign.tally(outcomes, todo):
        print(f"{prop:<{width}} {kernel:<{kwidth}} {n:>8} {bad:>6} {worst:>18.3f}")
    print("Worst error / allowed:")
    for o in sorted(outcomes, key=lambda o: -o.worst)[:8]:
        print(f"  {o.worst:8.3f}  {o.prop} [{o.kernel}] {o.problem.describe()}")
    if failures:     # each was reported in full on stderr as it happened; here a line each
        print(f"\n{len(failures)} failed (numba-flash replay FILE re-runs one):")
    for o, path in zip(failures, paths):
        print(f"  FAILED {o.prop} [{o.kernel}] {o.problem.describe()}\n    {path}")
    return 1 if failures else 0


def replay(path):
    """`numba-flash replay FILE`: re-run a reproducer's property on its kernel and saved
    arrays. Returns 0 when it passes now, 1 when it still fails, 2 when it cannot run (no
    such file, not a reproducer, a kernel or property not registered in this process)."""
    from .registry import PAIRS
    from .testing import campaign
    from .testing.properties import PROPERTIES
    try:
        prop, kernel, problem = campaign.load_reproducer(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        print(f"numba-flash replay: cannot read a reproducer from {path}: {e}", file=sys.stderr)
        return 2
    if kernel not in PAIRS or prop not in PROPERTIES:
        what = f"kernel {kernel!r}" if kernel not in PAIRS else f"property {prop!r}"
        print(f"numba-flash replay: {path} is for {what}, not registered in this process. A "
              "variant or property registered by a script is replayed from that script: "
              "register it, then call numba_flash.cli.main(['replay', FILE])", file=sys.stderr)
        return 2
    outcome = PROPERTIES[prop][0](kernel, problem)
    print(outcome.report())
    print("passes now" if outcome.ok else "still fails")
    return 0 if outcome.ok else 1


def info():
    import numba
    import numpy as np
    from numba import cuda
    from . import registry
    print(f"numba-flash: numpy {np.__version__}, numba {numba.__version__}")
    if numba_flash.SIMULATOR:
        print("device: Numba CUDA simulator (no GPU found)")
    else:
        dev = cuda.get_current_device()
        print(f"device: {dev.name.decode() if isinstance(dev.name, bytes) else dev.name}, "
              f"compute capability {dev.compute_capability}")
    device = registry.current_device()
    for name, pair in registry.PAIRS.items():
        print(f"kernel {name}: {pair.summary}")
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        print(f"kernel='auto' in {dtype}: " + ", ".join(
            f"d={d} {registry.resolve('auto', d, dtype, device).name}" for d in (64, 128, 256)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
