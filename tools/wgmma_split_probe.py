"""Can a wgmma's issue and its wait be separate inline-asm blocks in a Numba kernel, so that
other work (the softmax of the previous block, FlashAttention-3's overlap inside a warpgroup)
runs while the tensor core computes? Compiled for sm_90a without a GPU, like ptxas_check.py:

    CUDA_HOME=/usr/local/cuda python tools/wgmma_split_probe.py

Two kernels issue S = A B^T (m64n64k16 bf16, 4 steps) in one asm block whose outputs feed a
second asm block holding only `wgmma.wait_group 0` (the accumulators as tied operands), with
independent exp2 work between them; the second kernel also reads an accumulator before the
wait. ptxas reports, for a kernel where it had to move the wait up, "(C7517) warpgroup.wait is
injected ... to allow use of registers defined by GMMA". The probe prints ptxas's info for both
and exits 1 unless the first has no such report and the second has it (2026-12-04: so, with
58 registers each): the split compiles as written, and the report is how to see that it still
does in a real kernel.
"""

import os
import subprocess
import sys
import tempfile

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ptxas_check  # noqa: E402  (answers the current-device lookup with 9.0; finds ptxas)
from llvmlite import ir  # noqa: E402
from numba import cuda, float32, types  # noqa: E402
from numba.cuda.extending import intrinsic  # noqa: E402

REGS, N, STEPS = 32, 64, 4
RESULT = types.UniTuple(types.float32, REGS)
_ACC = "{" + ", ".join(f"${i}" for i in range(REGS)) + "}"
ISSUE = "\n".join(
    ["{", ".reg .b64 ad, bd;", "wgmma.fence.sync.aligned;"]
    + [f"add.s64 ad, ${REGS}, {16 * s}; add.s64 bd, ${REGS + 1}, {16 * s};\n"
       f"wgmma.mma_async.sync.aligned.m64n{N}k16.f32.bf16.bf16 {_ACC}, ad, bd, "
       f"{0 if s == 0 else 1}, 1, 1, 0, 0;" for s in range(STEPS)]
    + ["wgmma.commit_group.sync.aligned;", "}"])


def _tuple(context, builder, res):
    return context.make_tuple(builder, RESULT, [builder.extract_value(res, i)
                                                for i in range(REGS)])


@intrinsic
def issue(typingctx, a_desc, b_desc):
    """S = A B^T issued and committed, not waited for: the accumulators as a tuple."""
    def codegen(context, builder, sig, args):
        f32 = ir.FloatType()
        fn = ir.FunctionType(ir.LiteralStructType([f32] * REGS), [ir.IntType(64)] * 2
                             + [f32] * REGS)
        constraints = ",".join(["=f"] * REGS + ["l", "l"] + [str(i) for i in range(REGS)])
        asm = ir.InlineAsm(fn, ISSUE, constraints, side_effect=True)
        return _tuple(context, builder, builder.call(asm, list(args)
                                                     + [ir.Constant(f32, 0.0)] * REGS))
    return RESULT(a_desc, b_desc), codegen


@intrinsic
def wait(typingctx, acc):
    """wgmma.wait_group 0, the accumulators passed through (tied), so their uses follow it."""
    def codegen(context, builder, sig, args):
        f32 = ir.FloatType()
        fn = ir.FunctionType(ir.LiteralStructType([f32] * REGS), [f32] * REGS)
        constraints = ",".join(["=f"] * REGS + [str(i) for i in range(REGS)])
        asm = ir.InlineAsm(fn, "wgmma.wait_group.sync.aligned 0;", constraints,
                           side_effect=True)
        values = [builder.extract_value(args[0], i) for i in range(REGS)]
        return _tuple(context, builder, builder.call(asm, values))
    return RESULT(acc), codegen


def split(out, x, a_desc, b_desc):
    s = issue(a_desc[0], b_desc[0])
    other = float32(0.0)
    for i in range(32):                     # independent of s: runs under the product
        other += float32(2.0) ** (x[cuda.threadIdx.x, i] - float32(1.0))
    s = wait(s)
    for j in range(REGS):
        out[cuda.threadIdx.x, j] = s[j] + other


def split_misused(out, x, a_desc, b_desc):
    s = issue(a_desc[0], b_desc[0])
    other = float32(0.0)
    for i in range(32):                     # reads s[0] before the wait
        other += float32(2.0) ** (x[cuda.threadIdx.x, i] - s[0])
    s = wait(s)
    for j in range(REGS):
        out[cuda.threadIdx.x, j] = s[j] + other


def ptxas_info(fn, home):
    sig = (types.float32[:, ::1], types.float32[:, ::1], types.uint64[::1], types.uint64[::1])
    ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0))
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx.replace(".target sm_90", ".target sm_90a"))
    try:
        r = subprocess.run([os.path.join(home, "bin", "ptxas"), "-arch=sm_90a", "-v", f.name,
                            "-o", os.devnull], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if r.returncode:
        ptxas_check.exit_if_too_old("wgmma_split_probe", home, r.stderr)
        sys.exit(f"ptxas failed on {fn.__name__}: {r.stderr}")
    return [line.split("info    : ")[-1].strip() for line in r.stderr.splitlines()
            if "C7517" in line or "Used" in line or "spill" in line]


def main():
    home = ptxas_check.checked_home("wgmma_split_probe")   # as ptxas_check finds ptxas
    injected = {}
    for fn in (split, split_misused):
        info = ptxas_info(fn, home)
        injected[fn.__name__] = any("C7517" in line for line in info)
        print(f"{fn.__name__}:", *(line[:120] for line in info), sep="\n  ")
    ok = not injected["split"] and injected["split_misused"]
    print("the split compiles as written" if ok else "unexpected: see ptxas's info above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
