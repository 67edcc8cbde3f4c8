"""Host µs of one API forward of the 16-bit Hopper pair on the TMA path (wgmma16, bfloat16, d = 64,
causal), replayed from its plan (numba_flash.replay; also on two sets of tensors in turn) and in
full, its backward both ways, and of each piece of the full forward, each timed alone in a loop
without synchronization: the calls' memo, the registry's factory, the stream lookup, the two
allocations, the three array imports, the TMA checks and the tensor maps' cache, the results'
return, the Launcher's specialization lookup and argument packing, the launch itself, the API
forward with its launches left out (its host work but the launch's), and the driver and Numba calls
a launch made before 2026-12-06 (get_context, _to_core_stream, dimensions, LaunchConfig); beside
them torch's flash SDPA on the same inputs, and both with a synchronization a call (what
numba-flash bench pays). --profile adds cProfile's top functions of 2000 API forwards.

The default size is tiny (B = 1, H = 2, N = 128) so that the rows that launch a kernel are
bound by the host: at the benchmark's grid (--b 16 --h 32 --n 1024, a forward kernel of
~240 µs) a loop of 2000 calls fills the launch queue part way through and then runs at the
GPU's pace, so those rows blend the two and are neither (2026-12-06's entries before 15:32
timed such rows: 118.6 µs for the launch alone, 182 for the API forward).

    python tools/host_pieces.py [--b 1 --h 2 --n 128 --d 64] [--profile]

Run on an H100, 2026-12-06: at the benchmark's grid before plans
(notebooks/data/host-time-maps-h100-2026-12-06.txt), at the tiny size with plans at 17:26,
17:42 and 19:20 (notebooks/data/host-pieces-plans{,2,3}-h100-2026-12-06.txt), and keyed by
layout, with the row of two sets of tensors, at 20:08 (host-pieces-layout-h100-2026-12-06.txt).
"""

import numpy as np
from call_time import per_call_us  # (tools/, beside this script)


def us(f, reps=2000):
    """Host µs a call of f (call_time.per_call_us, more calls)."""
    return per_call_us(f, reps)


def main(argv=None):
    from numba_flash._gpu import require_gpu  # (first: numba_flash picks GPU or simulator)
    require_gpu("tools/host_pieces.py")
    import argparse
    import cProfile
    import ctypes
    import io
    import pstats
    from unittest import mock

    import torch
    from cuda.bindings import driver
    from cuda.core import LaunchConfig
    from numba.cuda.cudadrv import devices
    from numba.cuda.cudadrv.driver import _to_core_stream
    from numba.cuda.errors import normalize_kernel_dimensions
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from numba_flash import (api, arrays, flash_attention_backward, flash_attention_forward,
                             registry, replay)
    from numba_flash.kernels.launch import Launcher
    from numba_flash.kernels.sm90 import forward16, tma
    from numba_flash.kernels.support import ceil_div, head_grid

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("b", 1), ("h", 2), ("n", 128), ("d", 64)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--profile", action="store_true",
                    help="cProfile of 2000 API forwards, top 30 functions by own time")
    args = ap.parse_args(argv)
    b, h, n, d, profile = args.b, args.h, args.n, args.d, args.profile
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def forward():
        return flash_attention_forward(q, k, v, causal=True, kernel="wgmma16")

    def peer():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def synchronized(f):
        return lambda: (f(), torch.cuda.synchronize())

    def full_forward():         # the call in full, its key's first (numba_flash.replay)
        replay.clear()
        return forward()

    def recorded_forward():     # in full, its key's second: recorded, its plan made (+ a key)
        replay.clear()
        replay.repeated(replay.key((q, k, v), ("forward", True, type(None), None, type(None),
                                                None, type(None), None, str, "wgmma16")))
        return forward()

    sets = [(q, k, v), tuple(x.clone() for x in (q, k, v))]

    def forward_in_turn():      # replayed on two sets of tensors in turn, as a training
        sets.reverse()          # loop's come (its maps from tma.tensor_maps' cache)
        return flash_attention_forward(*sets[0], causal=True, kernel="wgmma16")

    rows = {"API forward": us(forward), "API forward + synchronize": us(synchronized(forward)),
            "API forward, two sets of tensors in turn": us(forward_in_turn),
            "API forward in full, key's first call": us(full_forward),
            "API forward in full, making its plan": us(recorded_forward),
            "replay.clear alone": us(replay.clear)}
    with mock.patch.object(replay, "key", lambda *a: None):     # no plan made or looked up
        rows["API forward in full, plans off"] = us(forward)
    dout = torch.randn_like(q)
    out, lse = forward()

    def backward():
        return flash_attention_backward(dout, q, k, v, out, lse, causal=True, kernel="wgmma16")
    rows["API backward"] = us(backward)
    with mock.patch.object(replay, "key", lambda *a: None):
        rows["API backward in full, plans off"] = us(backward)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):   # the peer's backend, chosen once
        rows["torch flash SDPA (peer)"] = us(peer)
        rows["torch flash SDPA + synchronize"] = us(synchronized(peer))
    pair = registry.PAIRS["wgmma16"]
    bf16 = np.dtype(arrays.BFLOAT16)
    launch_obj, threads = pair.make_forward(128, 64, d, True, bf16)
    launcher = launch_obj.tma[launch_obj.which(n)]       # the kernel the API runs at n
    ptr, stream = arrays.launch_stream(q)
    shape = (b * h, n, d)
    dq, dk, dv = (arrays.to_device(x, shape, ptr, as_dtype=np.uint16) for x in (q, k, v))
    out = arrays.empty_device(shape, arrays.BFLOAT16, like=q, as_dtype=np.uint16)
    lse = arrays.empty_device((b * h, n), np.float32, like=q)
    maps = tma.tensor_maps((dq, dk, dv), stream)
    grid = (ceil_div(n, 128), *head_grid(b * h))
    args = (dq, dk, dv, out, lse, np.float32(0.125 * np.log2(np.e)), h, 1, maps)
    options = ("forward", True, type(None), None, type(None), None, type(None), None, str,
               "wgmma16")
    rows["memo key + recall"] = us(lambda: api._recall(api._memo_key((q, k, v), options)))
    rows["pair.make_forward"] = us(lambda: pair.make_forward(128, 64, d, True, bf16))
    rows["launch_stream"] = us(lambda: arrays.launch_stream(q))
    rows["empty_device out"] = us(
        lambda: arrays.empty_device(shape, arrays.BFLOAT16, like=q, as_dtype=np.uint16))
    rows["empty_device lse"] = us(lambda: arrays.empty_device((b * h, n), np.float32, like=q))
    rows["to_device x3"] = us(
        lambda: [arrays.to_device(x, shape, ptr, as_dtype=np.uint16) for x in (q, k, v)])
    rows["tma_ready + aligned"] = us(lambda: tma.tma_ready(dq, dk, dv) and forward16.aligned(out))
    rows["tensor_maps (kept)"] = us(lambda: tma.tensor_maps((dq, dk, dv), stream))
    rows["from_device x2"] = us(lambda: (arrays.from_device(out, (b, h, n, d), q),
                                         arrays.from_device(lse, (b, h, n), q)))
    rows["Launcher.specialization"] = us(lambda: launcher.specialization(args))
    packers = launcher.specialization(args)[2]

    def pack():
        packed = []
        for p, a in zip(packers, args):
            p(a, packed)
        return packed
    rows["packing"] = us(pack)
    rows["Launcher.launch"] = us(lambda: launcher.launch(args, grid, threads, stream))
    # the API forward with every launch replaced by nothing: its host work but the launch's
    replay.clear()      # (a plan would launch without Launcher.launch; none is made here)
    with mock.patch.object(Launcher, "launch", lambda self, *a, **kw: None):
        rows["API forward, launches left out"] = us(forward)
    # what a launch called before 2026-12-06, and what replaced the first
    rows["numba get_context()"] = us(lambda: devices.get_context().device.id)
    rows["cuCtxGetCurrent (cuda.bindings)"] = us(lambda: driver.cuCtxGetCurrent())
    context = ctypes.c_void_p()
    libcuda = ctypes.CDLL("libcuda.so.1")
    rows["cuCtxGetCurrent (ctypes)"] = us(lambda: libcuda.cuCtxGetCurrent(ctypes.byref(context)))
    rows["torch.cuda.current_stream"] = us(lambda: torch.cuda.current_stream(q.device))
    rows["normalize_kernel_dimensions"] = us(lambda: normalize_kernel_dimensions(grid, threads))
    rows["_to_core_stream"] = us(lambda: _to_core_stream(stream))
    g, blk = normalize_kernel_dimensions(grid, threads)
    rows["LaunchConfig"] = us(lambda: LaunchConfig(grid=g, block=blk, shmem_size=launcher.nbytes))
    print(f"host us a call, wgmma16 bf16 B={b} H={h} N={n} d={d} causal, on "
          f"{torch.cuda.get_device_name()}")
    for name, value in rows.items():
        print(f"  {name:42s} {value:8.1f}")
    if profile:
        pr = cProfile.Profile()
        pr.runcall(lambda: [forward() for _ in range(2000)])
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(30)
        print("cProfile of 2000 API forwards (host-bound at this size), by own time:\n"
              + text.getvalue())


if __name__ == "__main__":
    main()
