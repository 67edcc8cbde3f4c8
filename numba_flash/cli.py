"""`numba-flash` console script (also `python -m numba_flash`): verify, bench, info."""

import argparse
import sys

import numba_flash


def main(argv=None):
    parser = argparse.ArgumentParser(prog="numba-flash", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_verify = sub.add_parser("verify", help="every registered kernel against the reference")
    p_verify.add_argument("--quiet", action="store_true", help="print failing rows only")
    p_bench = sub.add_parser("bench", help="TFLOP/s and peak memory beside the peers")
    p_bench.add_argument("--json", default="bench.json", help="file for every figure")
    p_bench.add_argument("--quick", action="store_true", help="a small grid (a smoke test)")
    p_bench.add_argument("--mode", choices=("fwd", "fwd+bwd", "both"), default="both")
    p_bench.add_argument("--long", action="store_true",
                         help="also forward+backward at N = 131072 (B 1, H 16, d 128, float32)")
    sub.add_parser("info", help="versions, device, registered kernels")
    sub.add_parser("tune", help="time the tiled kernels over tile and thread shapes")
    args = parser.parse_args(argv)

    if args.command == "verify":
        from . import verify
        return verify.main(numba_flash.SIMULATOR, quiet=args.quiet)
    if args.command == "bench":
        if numba_flash.SIMULATOR:
            print("numba-flash bench needs a CUDA GPU; none was found", file=sys.stderr)
            return 2
        from . import bench
        return bench.main(args.json, quick=args.quick, mode=args.mode, long=args.long)
    if args.command == "info":
        return info()
    if args.command == "tune":
        if numba_flash.SIMULATOR:
            print("numba-flash tune needs a CUDA GPU; none was found", file=sys.stderr)
            return 2
        from . import tune
        return tune.main()
    return 2


def info():
    import numba
    import numpy as np
    from numba import cuda
    from .kernels import BACKWARD, FORWARD
    print(f"numba-flash: numpy {np.__version__}, numba {numba.__version__}")
    if numba_flash.SIMULATOR:
        print("device: Numba CUDA simulator (no GPU found)")
    else:
        dev = cuda.get_current_device()
        print(f"device: {dev.name.decode() if isinstance(dev.name, bytes) else dev.name}, "
              f"compute capability {dev.compute_capability}")
    print(f"forward kernels: {sorted(FORWARD)}; backward kernels: {sorted(BACKWARD)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
