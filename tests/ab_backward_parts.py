"""Where the registered wgmma backward's time goes on a GPU, not a pytest module:

    python tests/ab_backward_parts.py [D ...]     # d = 64 and 128 by default

For N = 1k, 4k, 8k on the benchmark's grid (B*H = (16384 / N) (2048 / d)), float32: the API's
forward and backward (wall time, as the benchmark times them), then with CUDA events and every
array allocated beforehand: the preprocess kernel (D = rowsum(dO * O), dq zeroed), the dK/dV/dQ
kernel as registered before 2026-12-02 (scalar dQ atomics, Q blocks in order), with `rotate`
(each K/V block starts at another Q block), with vector atomics too, as registered now (at
d > 64 also S permuted for 16-byte loads), and (d > 64) without its dQ atomics (a wrong dq:
what the atomics cost); the API on torch tensors
(as the benchmark calls it) and the allocation of dq, dk, dv. Then the registered forward
kernel and its `rotate` option (each Q block starts at another K/V block).
"""
import sys
import time

import numpy as np
from numba import cuda

try:
    import torch
except ImportError:
    torch = None

import reference as ref
from numba_flash import flash_attention_backward, flash_attention_forward
from numba_flash.bench import _median_ms
from numba_flash.kernels import backward_wgmma, backward_wgmma_wide, forward_wgmma
from numba_flash.kernels.backward import run_preprocess
from numba_flash.kernels.support import ceil_div


def event_ms(fn, reps=10):
    """Median of reps CUDA-event timings of fn() (after one warm-up call)."""
    fn()
    times = []
    for _ in range(reps):
        start, end = cuda.event(), cuda.event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end))
    return float(np.median(times))


def main(dims):
    rng = np.random.default_rng(0)
    for d in dims:
        for n in (1024, 4096, 8192):
            bh = (16384 // n) * (2048 // d)
            q, k, v, dout = (cuda.to_device(rng.standard_normal((1, bh, n, d),
                                                                dtype=np.float32))
                             for _ in range(4))
            flops = ref.forward_flops(n, n, d, False, bh)
            tf = lambda ms, f=2.5 * flops: f"{ms:.2f} ms ({f / ms / 1e9:.1f} TFLOP/s)"
            out, lse = flash_attention_forward(q, k, v, kernel="wgmma")
            fwd = _median_ms(lambda: flash_attention_forward(q, k, v, kernel="wgmma"))
            bwd = _median_ms(lambda: flash_attention_backward(dout, q, k, v, out, lse,
                                                              kernel="wgmma"))
            print(f"d={d} N={n} B*H={bh}: API forward {tf(fwd, flops)}, API backward "
                  f"{tf(bwd)}", flush=True)
            q3, k3, v3, do3, o3 = (x.reshape(bh, n, d) for x in (q, k, v, dout, out))
            lse2 = lse.reshape(bh, n)
            D = cuda.device_array((bh, n), np.float32)
            dq, dk, dv = (cuda.device_array((bh, n, d), np.float32) for _ in range(3))
            run_pre = lambda: run_preprocess(do3, o3, D, dq, clear=True)
            print(f"  preprocess: {event_ms(run_pre):.3f} ms", flush=True)
            scale = np.float32(1 / np.sqrt(d))
            plain = dict(s_permuted=False, vector_loads=False)
            variants = {"scalar atomics, no rotate": dict(plain, rotate=False,
                                                          vector_atomics=False),
                        "rotate": dict(plain, rotate=True, vector_atomics=False),
                        "rotate, vector atomics": plain,
                        "registered": {}}
            if d > 64:
                variants["registered, no dQ atomics"] = dict(dq_atomics=False)
            for label, opts in variants.items():
                if d > 64:
                    kernel, threads = backward_wgmma_wide.make_wide_kernel(
                        False, **dict(backward_wgmma_wide.REGISTERED, **opts))
                elif label == "rotate, vector atomics":
                    continue            # d <= 64 has no permuted S: that is the registered one
                else:
                    kernel, threads = backward_wgmma.make_lean_kernel(
                        False, True, True, opts.get("rotate", True),
                        opts.get("vector_atomics", True))
                launch = kernel[(ceil_div(n, 64), bh), threads]
                ms = event_ms(lambda: launch(q3, k3, v3, do3, lse2, D, dk, dv, dq, scale,
                                             1, 1))
                print(f"  kernel {label}: {tf(ms)}", flush=True)
            blocks = forward_wgmma.default_blocks_or_fallback(d, np.float32)
            o, l2 = cuda.device_array((bh, n, d), np.float32), cuda.device_array((bh, n), np.float32)
            for label, opts in (("forward registered", {}), ("forward rotate", dict(rotate=True))):
                kernel, threads = forward_wgmma.make_forward_kernel(*blocks, d, False, np.float32,
                                                                    **opts)
                launch = kernel[(ceil_div(n, blocks[0]), bh), threads]
                ms = event_ms(lambda: launch(q3, k3, v3, o, l2, scale, 1, 1))
                print(f"  kernel {label}: {tf(ms, flops)}", flush=True)
            if torch is not None:
                tq, tk, tv, tdo = (torch.as_tensor(x, device="cuda") for x in (q, k, v, dout))
                tout, tlse = flash_attention_forward(tq, tk, tv, kernel="wgmma")
                fwd = _median_ms(lambda: flash_attention_forward(tq, tk, tv, kernel="wgmma"))
                bwd = _median_ms(lambda: flash_attention_backward(tdo, tq, tk, tv, tout, tlse,
                                                                  kernel="wgmma"))
                both = _median_ms(lambda: flash_attention_backward(
                    tdo, tq, tk, tv, *flash_attention_forward(tq, tk, tv, kernel="wgmma"),
                    kernel="wgmma"))
                print(f"  API on torch tensors: forward {tf(fwd, flops)}, backward {tf(bwd)}, "
                      f"forward+backward {tf(both, 3.5 * flops)}", flush=True)

            def alloc():
                arrs = [cuda.device_array((bh, n, d), np.float32) for _ in range(3)]
                cuda.synchronize()
                del arrs
            t0 = time.perf_counter()
            for _ in range(5):
                alloc()
            cuda.synchronize()
            print(f"  allocating dq, dk, dv: {(time.perf_counter() - t0) / 5 * 1e3:.2f} ms",
                  flush=True)


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [64, 128])
