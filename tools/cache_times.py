"""First-call times of the forward and the backward in fresh processes: with an empty kernel
disk cache (compiles), with the cache the first run filled (loads cubins), and with the cache
off (NUMBA_FLASH_CACHE=0), for every kernel named (default: auto).

    python tools/cache_times.py [--kernel auto fa2 tiled] [--d 64] [--n 1024] [--causal]
                                [--dir DIR] [--runs 1]

Each row is one fresh `python` process (a child of this one, importing numba_flash) that
times its first flash_attention_forward and then its first flash_attention_backward, and
reports the disk cache's hits and misses (numba_flash.kernels.cache.stats()). --dir: the
cache folder (default a temporary one, removed after; given, it is emptied first).
`--child` is the child's mode (prints one JSON line).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(kernel, d, n, causal):
    t0 = time.perf_counter()
    import numpy as np

    import numba_flash
    from numba_flash import flash_attention_backward, flash_attention_forward
    from numba_flash.kernels import cache
    imported = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    shape = (1, 4, n, d)
    q, k, v, dout = (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))
    t1 = time.perf_counter()
    out, lse = flash_attention_forward(q, k, v, causal=causal, kernel=kernel)
    t2 = time.perf_counter()
    dq, dk, dv = flash_attention_backward(dout, q, k, v, out, lse, causal=causal, kernel=kernel)
    t3 = time.perf_counter()
    print(json.dumps(dict(
        simulator=numba_flash.SIMULATOR, import_s=imported, forward_s=t2 - t1,
        backward_s=t3 - t2, cache=cache.stats(), enabled=cache.enabled(),
        root=str(cache.cache_root()), fingerprint=cache.FINGERPRINT[:16],
        out=float(np.abs(out).sum()), dq=float(np.abs(dq).sum()),
        out_bytes=out.tobytes().hex()[:64])))


def run_child(kernel, d, n, causal, cache_dir, enabled=True, pythonpath=None, timeout=600):
    """One fresh process; returns its JSON dict (raises with its stderr when it fails)."""
    env = dict(os.environ, NUMBA_FLASH_CACHE_DIR=str(cache_dir),
               NUMBA_FLASH_CACHE="1" if enabled else "0")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (pythonpath or ROOT, os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--kernel", kernel,
           "--d", str(d), "--n", str(n)] + (["--causal"] if causal else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=pythonpath or ROOT)
    if done.returncode:
        raise RuntimeError(f"child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def files_in(path):
    return sum(len(f) for _, _, f in os.walk(path))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernel", nargs="+", default=["auto"])
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--runs", type=int, default=1, help="cached runs per kernel")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.child:
        from numba_flash._gpu import require_gpu
        require_gpu("tools/cache_times.py")
    if args.child:
        return child(args.kernel[0], args.d, args.n, args.causal)
    top = args.dir or tempfile.mkdtemp(prefix="numba-flash-cache-")
    rows = []
    try:
        for kernel in args.kernel:
            where = os.path.join(top, kernel)
            shutil.rmtree(where, ignore_errors=True)
            runs = [("empty cache", run_child(kernel, args.d, args.n, args.causal, where))]
            runs += [("cached", run_child(kernel, args.d, args.n, args.causal, where))
                     for _ in range(args.runs)]
            runs.append(("cache off", run_child(kernel, args.d, args.n, args.causal, where,
                                                enabled=False)))
            same = len({r["out_bytes"] for _, r in runs}) == 1
            for label, r in runs:
                rows.append((kernel, label, r["forward_s"], r["backward_s"],
                             r["cache"]["hits"], r["cache"]["misses"], same))
            rows.append((kernel, "files", files_in(where), None, None, None, None))
    finally:
        if args.dir is None:
            shutil.rmtree(top, ignore_errors=True)
    print(f"first forward and first backward in a fresh process, d={args.d} N={args.n} "
          f"B*H=4 float32 causal={args.causal} (seconds; hits/misses: kernel disk cache)")
    print(f"{'kernel':8} {'process':12} {'forward':>8} {'backward':>9} {'hits':>5} "
          f"{'misses':>6}  same output")
    for kernel, label, fwd, bwd, hits, misses, same in rows:
        if label == "files":
            print(f"{kernel:8} {'cache files':12} {fwd:>8}")
            continue
        print(f"{kernel:8} {label:12} {fwd:8.2f} {bwd:9.2f} {hits:5} {misses:6}  {same}")


if __name__ == "__main__":
    main()
