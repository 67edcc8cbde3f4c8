"""Compile the wgmma kernels for sm_90a on a machine without a GPU and print what ptxas says of
them (registers, local memory, spills), not a pytest module:

    pip install "nvidia-cuda-nvrtc>=13,<14"      # numba-cuda's NVRTC; NVVM and ptxas come
    CUDA_HOME=/usr/local/cuda python tests/ptxas_check.py [WORD ...]   # from a CUDA toolkit

WORD keeps only the kernels whose label contains it. The simulator cannot tell whether a kernel
compiles for a GPU (shapes of local arrays must be named constants there, not expressions) or
whether its arrays stay in registers; this can, in seconds: on 2026-12-01 it showed the first
wgmma forward's loops over steps putting 384 bytes of arrays in local memory (its fix: the steps
written out) and its registers as the GPU's ptxas reported them (145, 170, 240); later the wide
forward's spills (Q's loads hoisted out of its K/V loop) before any GPU run.
Device functions compile for the current device's compute capability, so that lookup is
answered with 9.0 here (there is no device)."""
import os
import subprocess
import sys

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"

import numba.cuda.dispatcher as dispatcher  # noqa: E402
from numba import cuda, float32, int64, types  # noqa: E402


class _Hopper:
    compute_capability = (9, 0)


dispatcher.get_current_device = lambda: _Hopper()

from numba_flash.kernels import (backward_wgmma, backward_wgmma_wide, forward_wgmma,  # noqa: E402
                                 forward_wgmma_wide)

A3, A2 = types.Array(float32, 3, "C"), types.Array(float32, 2, "C")
FORWARD_ARGS = (A3, A3, A3, A3, A2, float32, int64, int64)
BACKWARD_ARGS = (A3, A3, A3, A3, A2, A2, A3, A3, A3, float32, int64, int64)


def kernels():
    """(label, Python function, argument types) of each kernel to compile."""
    for opts in (dict(), dict(causal=True), dict(paired=False), dict(loads=8),
                 dict(prefetch=True), dict(pv_chained=True), dict(causal=True, pv_chained=True)):
        kernel, _ = forward_wgmma.make_wgmma_kernel(**{"causal": False, **opts})
        yield f"forward_wgmma {opts}", kernel.kernel.py_func, FORWARD_ARGS
    for opts in (dict(), dict(causal=True), dict(pv_chained=True),
                 dict(causal=True, pv_chained=True), dict(pv_chained=True, s_chained=True),
                 dict(causal=True, pv_chained=True, s_chained=True),
                 dict(forward_wgmma_wide.REGISTERED),
                 dict(forward_wgmma_wide.REGISTERED, causal=True),
                 dict(forward_wgmma_wide.REGISTERED, vector_loads=False),
                 dict(forward_wgmma_wide.REGISTERED, rotate=True)):
        kernel, _ = forward_wgmma_wide.make_wide_kernel(**{"causal": False, **opts})
        yield f"wide forward {opts}", kernel.kernel.py_func, FORWARD_ARGS
    for opts in ((False, False), (True, False), (True, True), (True, True, True, True)):
        kernel, _ = backward_wgmma.make_lean_kernel(False, *opts)
        yield (f"lean backward (paired_steps, ahead, rotate, vector_atomics)={opts}",
               kernel.kernel.py_func, BACKWARD_ARGS)
    for opts in (dict(), dict(ahead=True), dict(causal=True, ahead=True),
                 dict(s_chained=True), dict(ahead=True, s_chained=True),
                 dict(causal=True, ahead=True, s_chained=True),
                 dict(s_chained=True, w_chained=True),
                 dict(ahead=True, s_chained=True, w_chained=True),
                 dict(causal=True, ahead=True, s_chained=True, w_chained=True),
                 dict(backward_wgmma_wide.REGISTERED),
                 dict(backward_wgmma_wide.REGISTERED, causal=True),
                 dict(backward_wgmma_wide.REGISTERED, vector_atomics=False, vector_loads=False)):
        kernel, _ = backward_wgmma_wide.make_wide_kernel(**{"causal": False, **opts})
        yield f"wide backward {opts}", kernel.kernel.py_func, BACKWARD_ARGS


def main(words):
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for label, fn, args in kernels():
        if words and not any(w in label for w in words):
            continue
        ptx, _ = cuda.compile_ptx(fn, args, cc=(9, 0))
        ptx = ptx.replace(".target sm_90", ".target sm_90a")    # wgmma needs the a-target
        path = "/tmp/" + "".join(c if c.isalnum() else "_" for c in label) + ".ptx"
        with open(path, "w") as f:
            f.write(ptx)
        r = subprocess.run([os.path.join(home, "bin", "ptxas"), "-arch=sm_90a", "-v", path,
                            "-o", os.devnull], capture_output=True, text=True)
        info = [line.split("info    : ")[-1].strip() for line in r.stderr.splitlines()
                if "Used" in line or "spill" in line]
        print(f"{label}: {'; '.join(info) if r.returncode == 0 else r.stderr.strip()}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
