"""Compile the registered kernels for sm_90a on a machine without a GPU and print what ptxas
says of them (registers, stack, spills, and its wgmma reports: C7513 "serialized", C7517 "wait
injected", where it had to run a kernel's products one at a time), then a table:

    pip install "nvidia-cuda-nvrtc>=13,<14"      # numba-cuda's NVRTC; NVVM and ptxas come
    CUDA_HOME=/usr/local/cuda python tools/ptxas_check.py [WORD ...]   # from a CUDA toolkit

or, with the .[cu13] extra's wheels (NVVM among them), `pip install nvidia-cuda-nvcc` of the
same version as nvidia-nvvm and no CUDA_HOME: ptxas is then taken from beside it. ptxas must be
at least as new as the NVVM that writes the PTX ("Unsupported .version" otherwise).

--sass: also count each kernel's SASS instructions (FMUL, FFMA, FADD, FMNMX, MUFU, HGMMA,
HMMA, LDS, BAR, SHFL, LDG, BSSY: the convergence barriers a branch around divergent code costs;
total; static counts) with cuobjdump, e.g. to see what a change to the
softmax costs in instructions before a GPU times it, and a digest of the listing (sha1,
function names left out): a refactor shows it changed no kernel when the digests before and
after match (the dQ pass's removal of 2026-12-07, the lean forward's early loads of 12-08). --sections (implies --sass): also the
instructions before, in and after the main loop and in subroutines (tools/sass.py), what a
block does once against what it does every step (forward16 at d = 64, 2026-12-04: 913 / 526
/ 486 / 307, docs/performance.md).

WORD ...: keep only the kernels whose label contains every WORD (e.g. `sm90 wide backward`,
`fa2`, `causal=True`). The kernels are those the registered pairs launch, taken from the
launchers the pairs call (so a variant this file does not name is not compiled):

    sm90 (the "wgmma" pair, float32):
      forward   lean (d <= 64) and wide (64 < d <= 128), vector (K/V by cp.async) and scalar
                loads, causal both;
      backward  the dK/dV(/dQ) kernel, lean and wide, vector and scalar, dq_out True (dQ by
                atomics) and False (the deterministic path's), causal both;
      dq        the deterministic dQ pass (wide: d > 64; vector and scalar loads), causal both;
      each also as its half-input variant (label "... half": the products of the half
      inputs' zero small parts not issued);
    sm90 forward16 and backward16 (the "wgmma16" pair: its forward, its dK/dV kernel): d = 64
      and 128, bfloat16 and float16, causal both; "... tma": the forward staged by TMA (what
      the pair runs where the arrays allow it), "vector" by cp.async, "scalar" element by
      element; "mma16 ...": the same kernels on mma.sync (the "mma16" pair), compiled for
      sm_80;
    fa2 (float32, default tiles, d = 64 and 128, not causal):
      forward, the backward's dK/dV kernel with dq_atomic=True (as run_backward configures it),
      and the deterministic path's dK/dV and dQ kernels.

A launcher that picks a vector or a scalar kernel by alignment (vector_io.AlignedDispatch)
gives two labels, "... vector" and "... scalar".

The simulator cannot tell whether a kernel compiles for a GPU (shapes of local arrays must be
named constants there, not expressions) or whether its arrays stay in registers; this can, in
seconds a kernel: on 2026-12-01 it showed the first wgmma forward's loops over steps putting
384 bytes of arrays in local memory (its fix: the steps written out) and its registers as the
GPU's ptxas reported them (145, 170, 240); later the wide forward's spills (Q's loads hoisted
out of its K/V loop) before any GPU run.

How: NUMBA_ENABLE_CUDASIM=0 so that the real numba.cuda is imported; device functions compile
for the current device's compute capability, so that lookup (numba.cuda.dispatcher.
get_current_device) is answered with 9.0 (there is no device); cuda.compile_ptx of each
kernel's Python function at the argument types the API launches it with, `.target sm_90`
made `sm_90a` (wgmma needs the a-target), then `ptxas -arch=sm_90a -v` (with -maxrregcount
where the kernel's cuda.jit sets max_registers).
"""
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
# this checkout's numba_flash, not the one an editable install points at (run from another
# worktree, `python tools/ptxas_check.py` would otherwise compile that one's kernels)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))     # tools/sass.py

import numba.cuda.dispatcher as dispatcher  # noqa: E402
import numpy as np  # noqa: E402
from numba import cuda, float32, int64, types  # noqa: E402


class _Hopper:
    compute_capability = (9, 0)


dispatcher.get_current_device = lambda: _Hopper()

from numba_flash.kernels import backward_fa2, forward_fa2  # noqa: E402
from numba_flash.kernels.sm90 import backward as sm90_backward  # noqa: E402
from numba_flash.kernels.sm90 import dq as sm90_dq  # noqa: E402
from numba_flash.kernels.sm90 import forward as sm90_forward  # noqa: E402
from numba_flash.kernels.sm90 import backward16 as sm90_backward16  # noqa: E402
from numba_flash.kernels.sm90 import forward16 as sm90_forward16  # noqa: E402
from numba_flash.kernels.support import Launcher  # noqa: E402
from numba_flash.kernels.vector_io import AlignedDispatch  # noqa: E402
import sass  # noqa: E402

A3, A2 = types.Array(float32, 3, "C"), types.Array(float32, 2, "C")
H3 = types.Array(types.uint16, 3, "C")          # 16-bit patterns (the wgmma16 forward)
# (q, k, v, out, lse, scale log2, heads, group, maps): maps the TMA kernel's tensor maps; the
# others are given lse there (unused)
FORWARD16_ARGS = (H3, H3, H3, H3, A2, float32, int64, int64, A2)
FORWARD16_TMA_ARGS = FORWARD16_ARGS[:-1] + (types.Array(types.uint8, 2, "C"),)
# (q, k, v, dout, lse, D, dk, dv, dq, scale, heads, group)
DKDV16_ARGS = (H3, H3, H3, H3, A2, A2, H3, H3, A3, float32, int64, int64)   # dk, dv 16-bit
# (q, k, v, out, lse, scale, heads, group)
FORWARD_ARGS = (A3, A3, A3, A3, A2, float32, int64, int64)
# (q, k, v, dout, lse, D, dk, dv, dq, scale, heads, group)
DKDV_ARGS = (A3, A3, A3, A3, A2, A2, A3, A3, A3, float32, int64, int64)
# the ordered lean kernel (deterministic, d <= 64): then sem, int32 (B*H, Q blocks)
ORDERED_ARGS = DKDV_ARGS + (types.Array(types.int32, 2, "C"),)
# (q, k, v, dout, lse, D, dq, scale, heads, group)
DQ_ARGS = (A3, A3, A3, A3, A2, A2, A3, float32, int64, int64)
F32 = np.dtype(np.float32)


def _dispatchers(label, launcher):
    """(label, numba dispatcher) of each kernel behind a launcher: an AlignedDispatch gives its
    vector and scalar kernels, a Launcher its kernel."""
    if isinstance(launcher, AlignedDispatch):
        yield from _dispatchers(f"{label} vector", launcher.vector)
        yield from _dispatchers(f"{label} scalar", launcher.scalar)
    elif hasattr(launcher, "dispatch"):          # forward16's launcher (scale -> scale log2 e)
        for tag, tma, dispatch in zip(("", " round"), launcher.tma, launcher.dispatch):
            if tma is not None:                  # (round: the kernels round the heads)
                yield from _dispatchers(f"{label}{tag} tma", tma)
            yield from _dispatchers(f"{label}{tag}", dispatch)
    elif isinstance(launcher, Launcher):
        yield from _dispatchers(label, launcher.kernel)
    elif hasattr(launcher, "py_func"):
        yield label, launcher
    else:
        raise TypeError(f"{label}: cannot find the kernel in {type(launcher).__name__}")


def kernels():
    """(label, numba dispatcher, argument types) of each kernel to compile; the Hopper
    family's also in its half-input variant (" half": fewer products, registry half_inputs)."""
    for causal, half in ((c, h) for h in (False, True) for c in (False, True)):
        tag = " half" if half else ""
        for d, size in ((64, "lean"), (128, "wide")):
            bm, bn = sm90_forward.tiles(d)
            launcher, _ = sm90_forward.make_forward_kernel(
                bm, bn, d, causal, np.dtype("bfloat16") if half else F32)
            for label, kernel in _dispatchers(f"sm90 forward {size} causal={causal}{tag}",
                                              launcher):
                yield label, kernel, FORWARD_ARGS
        for dq_out in (True, False):
            for wide, size in ((False, "lean"), (True, "wide")):
                launcher, _ = sm90_backward.dkdv_launcher(wide, causal, dq_out, half)
                for label, kernel in _dispatchers(
                        f"sm90 backward {size} causal={causal} dq_out={dq_out}{tag}",
                        launcher):
                    yield label, kernel, DKDV_ARGS
        launcher, _ = sm90_backward.dkdv_launcher(False, causal, True, half, ordered=True)
        for label, kernel in _dispatchers(f"sm90 backward lean causal={causal} ordered{tag}",
                                          launcher):
            yield label, kernel, ORDERED_ARGS
        launcher, _, _ = sm90_dq.launcher(causal, half)
        for label, kernel in _dispatchers(f"sm90 dq wide causal={causal}{tag}", launcher):
            yield label, kernel, DQ_ARGS
    for causal, fmt, d in ((c, f, d) for c in (False, True) for f in ("bfloat16", "float16")
                           for d in (64, 128)):
        launcher, _ = sm90_forward16.make_forward_kernel(*sm90_forward16.tiles(d), d, causal,
                                                         np.dtype(fmt), tma=True)
        for label, kernel in _dispatchers(f"sm90 forward16 d={d} {fmt} causal={causal}",
                                          launcher):
            yield label, kernel, FORWARD16_TMA_ARGS if label.endswith("tma") else \
                FORWARD16_ARGS
        launcher = sm90_backward16.dkdv_launcher(d, causal, fmt)
        for label, kernel in _dispatchers(f"sm90 backward16 d={d} {fmt} causal={causal}",
                                          launcher):
            yield label, kernel, DKDV16_ARGS
        # the same kernels on mma.sync (the "mma16" pair), compiled for sm_80 (A100)
        launcher, _ = sm90_forward16.make_forward_kernel(*sm90_forward16.tiles(d), d, causal,
                                                         np.dtype(fmt), products="mma")
        for label, kernel in _dispatchers(f"mma16 forward16 d={d} {fmt} causal={causal}",
                                          launcher):
            yield label, kernel, FORWARD16_ARGS, "sm_80"
        launcher = sm90_backward16.dkdv_launcher(d, causal, fmt, "mma")
        for label, kernel in _dispatchers(f"mma16 backward16 d={d} {fmt} causal={causal}",
                                          launcher):
            yield label, kernel, DKDV16_ARGS, "sm_80"
    for d in (64, 128):
        bm, bn = forward_fa2.default_blocks(d, F32)
        launcher, _ = forward_fa2.make_forward_kernel(bm, bn, d, False, F32)
        for label, kernel in _dispatchers(f"fa2 forward d={d} {bm}x{bn}", launcher):
            yield label, kernel, FORWARD_ARGS
        # as run_backward configures them (registry._fa2_backward: dq_atomic = not deterministic)
        for atomic in (True, False):
            bm, bn = (backward_fa2.default_blocks_atomic(d, F32) if atomic
                      else backward_fa2.default_blocks(d, F32))
            launcher, _ = backward_fa2.make_dkdv_kernel(
                bm, bn, d, False, F32, None, atomic, None if atomic else False,
                backward_fa2.prefetch_by_default(F32, atomic),
                backward_fa2.tensor_cores_by_default(F32, atomic))
            for label, kernel in _dispatchers(
                    f"fa2 backward dkdv d={d} {bm}x{bn} dq_atomic={atomic}", launcher):
                yield label, kernel, DKDV_ARGS
        bm, bn = backward_fa2.default_blocks(d, F32)
        launcher, _ = backward_fa2.make_dq_kernel(bm, bn, d, False, F32)
        for label, kernel in _dispatchers(f"fa2 backward dq d={d} {bm}x{bn}", launcher):
            yield label, kernel, DQ_ARGS


SASS_OPS = ("FMUL", "FFMA", "FADD", "FMNMX", "MUFU", "HGMMA", "HMMA", "LDS", "BAR", "SHFL", "LDG", "BSSY")
SECTIONS = ("before", "loop", "after", "subroutines", "calls")


def sass_counts(cubin, sections=False):
    """{op: count} of the SASS instructions of a cubin, NOPs left out (static counts: every
    copy of a loop body once; tools/sass.py reads the listing), by cuobjdump -sass (it needs nvdisasm beside it or at $NVDISASM_PATH; without
    a toolkit that has them: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, whose
    nvidia/cu13/bin goes on PATH); with sections, also tools/sass.py's counts before, in and
    after the main loop (keys "before", "loop", ...: lower case, unlike the ops)."""
    text = subprocess.run(["cuobjdump", "-sass", cubin], capture_output=True, text=True,
                          check=True).stdout
    ops = {}
    for _, op, _ in sass.instructions(text):
        ops[op] = ops.get(op, 0) + 1
    if sections:
        ops.update(sass.sections(text))
    # the listing's digest, its header and function-name lines left out (the names carry
    # Numba's mangling): two builds of a kernel with the same digest run the same code
    listing = "\n".join(line for line in text.splitlines()
                        if "Function :" not in line and ".text." not in line)
    ops["digest"] = hashlib.sha1(listing.encode()).hexdigest()[:10]
    return ops


SETUP = ("ptxas must be at least as new as numba-cuda's NVVM: with the .[cu13] extra (its "
         "nvidia-nvvm wheel), `pip install nvidia-cuda-nvcc` of the same version (ptxas is "
         "then found beside it), or set CUDA_HOME to a CUDA toolkit whose NVVM numba-cuda uses")


def toolkit_home():
    """Where bin/ptxas is looked for: $CUDA_HOME, else the nvidia/cu13 wheels' folder when the
    nvidia-cuda-nvcc wheel put a ptxas there (it matches the nvidia-nvvm wheel's PTX), else
    /usr/local/cuda."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    spec = importlib.util.find_spec("nvidia")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if os.path.exists(os.path.join(folder, "cu13", "bin", "ptxas")):
            return os.path.join(folder, "cu13")
    return "/usr/local/cuda"


def checked_home(tool):
    """toolkit_home(), or exit naming `tool` and what to install when it has no bin/ptxas."""
    home = toolkit_home()
    if not os.path.exists(os.path.join(home, "bin", "ptxas")):
        sys.exit(f"{tool}: no ptxas at {home}/bin: {SETUP}")
    return home


def exit_if_too_old(tool, home, stderr):
    """Exit naming `tool` and what to install where ptxas's stderr says the PTX is newer than
    it ('Unsupported .version': the NVVM that wrote it is newer than this ptxas)."""
    if "Unsupported .version" in stderr:
        sys.exit(f"{tool}: {home}/bin/ptxas is older than the NVVM that wrote the PTX "
                 f"({stderr.strip().splitlines()[0]}): {SETUP}")


def ptxas(label, kernel, args, home, arch="sm_90a", sass=False, sections=False):
    """ptxas -v's figures for one kernel compiled for `arch` ("sm_90a", or "sm_80" for the
    mma16 kernels): dict(registers, stack, spill_stores, spill_loads, seconds, and with sass
    the SASS op counts), or dict(error=...)."""
    options = getattr(kernel, "targetoptions", {})
    t0 = time.perf_counter()
    cc = (9, 0) if arch == "sm_90a" else (int(arch[3]), int(arch[4]))
    ptx, _ = cuda.compile_ptx(kernel.py_func, args, cc=cc,
                              fastmath=options.get("fastmath", False),
                              lineinfo=options.get("lineinfo", False),
                              launch_bounds=options.get("launch_bounds"))
    if arch == "sm_90a":
        ptx = ptx.replace(".target sm_90", ".target sm_90a")    # wgmma needs the a-target
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False,
                                     prefix="ptxas_check_") as f:
        f.write(ptx)
    cubin = f.name[:-4] + ".cubin"
    command = [os.path.join(home, "bin", "ptxas"), f"-arch={arch}", "-v", f.name, "-o",
               cubin if sass else os.devnull]
    if options.get("max_registers"):
        command[1:1] = ["-maxrregcount", str(options["max_registers"])]
    try:
        r = subprocess.run(command, capture_output=True, text=True)
        ops = sass_counts(cubin, sections) if sass and r.returncode == 0 else {}
    finally:
        os.unlink(f.name)
        if os.path.exists(cubin):
            os.unlink(cubin)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        return dict(error=r.stderr.strip(), seconds=seconds)
    text = r.stderr

    def figure(pattern):
        m = re.search(pattern, text)
        return int(m.group(1)) if m else None
    # ptxas's wgmma reports: C7513 "wgmma.mma_async instructions are serialized due to ...",
    # C7517 "warpgroup.wait is injected ...": the kernel runs, its products one at a time
    wgmma_notes = sorted(set(re.findall(r"\((C75\d\d)\)", text)))
    return dict(registers=figure(r"Used (\d+) registers"),
                stack=figure(r"(\d+) bytes stack frame"),
                spill_stores=figure(r"(\d+) bytes spill stores"),
                spill_loads=figure(r"(\d+) bytes spill loads"),
                wgmma=",".join(wgmma_notes) or "-",
                info="; ".join(line.split("info    : ")[-1].strip()[:160]
                               for line in text.splitlines()
                               if "Used" in line or "spill" in line or "(C75" in line),
                seconds=seconds, sass=ops)


def table(rows):
    width = max([len(label) for label, _ in rows] + [6])
    sass = any(r.get("sass") for _, r in rows)
    lines = [f"{'kernel':<{width}}  {'regs':>4}  {'stack':>5}  {'spill st':>8}  {'spill ld':>8}"
             f"  wgmma" + ("  SASS " + " ".join(SASS_OPS) + " total" if sass else "")]
    for label, r in rows:
        if "error" in r:
            lines.append(f"{label:<{width}}  ptxas failed: {r['error'].splitlines()[0][:80]}")
        else:
            ops = r.get("sass") or {}
            parts = {k: v for k, v in ops.items() if k.isupper()}
            counts = (" ".join(f"{ops.get(op, 0)}" for op in SASS_OPS)
                      + f" {sum(parts.values())}") if sass else ""
            if "loop" in ops:
                counts += "  " + " ".join(f"{k} {ops[k]}" for k in SECTIONS)
            if "digest" in ops:
                counts += f"  sha1 {ops['digest']}"
            lines.append(f"{label:<{width}}  {r['registers']:>4}  {r['stack']:>5}  "
                         f"{r['spill_stores']:>8}  {r['spill_loads']:>8}  {r['wgmma']}"
                         + (f"  {counts}" if counts else ""))
    return "\n".join(lines)


def main(words):
    sections = "--sections" in words
    sass = "--sass" in words or sections
    words = [w for w in words if w not in ("--sass", "--sections")]
    home = checked_home("ptxas_check")
    rows = []
    for label, kernel, args, *arch in kernels():
        if words and not all(w in label for w in words):
            continue
        r = ptxas(label, kernel, args, home, *arch, sass=sass, sections=sections)
        exit_if_too_old("ptxas_check", home, r.get("error", ""))
        rows.append((label, r))
        print(f"{label}: {r.get('info') or r.get('error')} ({r['seconds']:.0f} s)", flush=True)
    if not rows:
        sys.exit(f"ptxas_check: no kernel label contains all of {words}")
    print()
    print(table(rows))
    return 1 if any("error" in r for _, r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
