"""16-bit tile products by warp-wide `mma.sync.m16n8k16` (sm_80 and later): the products of
sm90/wgmma16.py, same operands, same layouts, same results' registers, for GPUs without wgmma
(A100, L4, RTX 30/40). The "mma16" pair runs sm90's forward16 and backward16 on them
(`engine("mma", ...)`), the "wgmma16" pair on wgmma (`engine("wgmma", ...)`).

Why the kernels need no change: a wgmma m64nNk16 product gives warp w of the warpgroup rows
16 w .. 16 w + 15 of the 64 x N result, in N / 8 tiles of 16 x 8 laid out in registers exactly
as mma.m16n8k16's accumulator (wgmma.position), and its register A fragment is
mma.m16n8k16's (wgmma16.a_fragment16). So each warp here issues, per k16 step, one
mma.sync per 8 columns on its own 16 rows, reading its fragments from the same shared tiles:

    A, K-major (core matrices, wgmma16.core_offset16): a0..a3 = (row g, k 2t..2t+1),
        (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..): one 32-bit load each (a core matrix
        row is 16 contiguous bytes; a warp's 32 words are one core matrix, 32 banks)
    B, K-major (n x K): b0, b1 = (column g, k 2t..2t+1), (g, 2t + 8..): 32-bit loads too
    B transposed (b_rows=W, the tile's rows are the contraction): ldmatrix.x4.trans, four
        8 x 8 core matrices (k rows 16 s.. and 16 s + 8.. of columns 8 nt.. and 8 nt + 8..)
        transposed into b0, b1 of tiles nt and nt + 1

and accumulates in float32 in the tensor core, step after step (as wgmma chains its steps).
mma.sync is synchronous: "issue" computes, "wait" passes its argument through, and no proxy
fence is needed between cp.async's stores and these loads (ordinary shared-memory reads).

    products16(n, KA, KB, fmt, b_rows=None)   wgmma16.products16's dict (mma_ss, mma_rs,
                                              ss_issue, rs_issue, rs_descriptor, regs)
    make_wait(pending, acc_regs)              (wait_s, wait_acc): pass-throughs
    engine(name, wgmma)                       "wgmma" or "mma": what forward16/backward16 use

On the simulator both engines are the NumPy model of sm90.wgmma16 (exact products summed in
float64, rounded to float32 once per product): the kernels' indexing is checked there, the
tensor core's own rounding and these fragment loads only on a GPU.
"""

import functools
from types import SimpleNamespace

from numba import cuda, types, uint32

from .support import SIMULATOR, device_function
from .sm90 import wgmma16

STEP16 = wgmma16.STEP16
WARP = 32


@device_function
def no_fence():
    """Nothing to order: mma.sync reads shared memory through the generic proxy."""
    pass


if SIMULATOR:
    products16 = wgmma16.products16
    make_wait = wgmma16.make_wait
else:
    from .sm90.wgmma import shared_address
    from .sm90.wgmma16 import array_asm, tuple_asm
    from .support import U

    _PTX_TYPE = {"bfloat16": "bf16", "float16": "f16"}

    def _mma(t, acc, a, b):
        return (f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {acc}, {a}, {b}, {acc};")

    def _b_loads(s, nt, K, W, b):
        """PTX loading tile nt's b0, b1 of step s (and, transposed, nt + 1's) into registers
        named in b; offsets in bytes from the thread's B address (operand $B)."""
        if W is None:       # element (8 nt + g, 16 s + 2t + 8 j) at (nt K/8 + 2 s + j) 64 + 8 g + 2 t
            return [f"ld.shared.b32 {b[j]}, [$B+{2 * ((nt * (K // 8) + 2 * s + j) * 64)}];"
                    for j in range(2)]
        # matrix q of the x4 (q = lane // 8 gives the row addresses): k rows 16 s + 8 (q % 2),
        # columns 8 (nt + q // 2); the thread's part of the address holds q and the row
        return [f"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{', '.join(b)}}}, "
                f"[$B+{2 * ((2 * s * (W // 8) + nt) * 64)}];"]

    def _product_text(n, steps, K, fmt, W, a_op, b_op):
        """The PTX of one product: outputs $0..$(n/2 - 1), tied to inputs after the operands;
        A by the thread's address in operand a_op (an int), or from registers (a_op a range of
        4 steps operands); B by the thread's address in operand b_op."""
        t = _PTX_TYPE[fmt]
        lines = ["{", ".reg .b32 fa<4>, fb<4>;"]
        for s in range(steps):
            if isinstance(a_op, range):
                a = "{" + ", ".join(f"${a_op[4 * s + e]}" for e in range(4)) + "}"
            else:
                # a_e: rows + 8 (e % 2), k + 8 (e // 2): (i K/8 + 2 s + j) 64 elements on
                for e in range(4):
                    i, j = e % 2, e // 2
                    offset = 2 * ((i * (K // 8) + 2 * s + j) * 64)
                    lines.append(f"ld.shared.b32 fa{e}, [$A+{offset}];")
                a = "{fa0, fa1, fa2, fa3}"
            if W is None:
                for nt in range(n // 8):
                    lines += _b_loads(s, nt, K, W, ["fb0", "fb1"])
                    acc = "{" + ", ".join(f"${4 * nt + e}" for e in range(4)) + "}"
                    lines.append(_mma(t, acc, a, "{fb0, fb1}"))
            else:
                for nt in range(0, n // 8, 2):
                    lines += _b_loads(s, nt, K, W, ["fb0", "fb1", "fb2", "fb3"])
                    for tile, b in ((nt, "{fb0, fb1}"), (nt + 1, "{fb2, fb3}")):
                        acc = "{" + ", ".join(f"${4 * tile + e}" for e in range(4)) + "}"
                        lines.append(_mma(t, acc, a, b))
        lines.append("}")
        text = "\n".join(lines).replace("$B", f"${b_op}")
        return text if isinstance(a_op, range) else text.replace("$A", f"${a_op}")

    def _ss_intrinsic(n, steps, K, fmt, W):
        """A B^T over `steps` k16 steps from a fresh (zero) accumulator: (a_addr, b_addr) ->
        tuple of n / 2 float32; a_addr, b_addr the thread's u32 shared addresses."""
        regs = n // 2
        # operands: $regs = A address, $regs + 1 = B address, then the tied zeros
        return tuple_asm(_product_text(n, steps, K, fmt, W, regs, regs + 1), regs,
                         types.uint32, clobber=True)

    def _rs_intrinsic(n, steps, K, fmt, W):
        """acc += A B^T, A from registers (a local uint32 array, 4 words a step), B by the
        thread's u32 shared address; acc a local float32 array of n / 2, read and written."""
        regs = n // 2
        n_a = 4 * steps
        text = _product_text(n, steps, K, fmt, W, range(regs, regs + n_a), regs + n_a)
        return array_asm(text, regs, n_a, types.uint32, clobber=True)

    @functools.lru_cache(maxsize=None)
    def products16(n, KA, KB, fmt, b_rows=None):
        """wgmma16.products16's dict on mma.sync (see the module); same checks."""
        wgmma16.products16(n, KA, KB, fmt, b_rows)          # its ValueErrors
        if b_rows is not None and n % 16:
            raise ValueError(f"a transposed B is loaded 16 columns at a time, got n={n}")
        W = b_rows
        ss = _ss_intrinsic(n, KA // STEP16, KA, fmt, W)
        rs = _rs_intrinsic(n, KB // STEP16, KB, fmt, W)

        @cuda.jit(device=True)
        def thread_parts():
            tid = U(cuda.threadIdx.x) % U(128)
            warp, lane = tid // U(WARP), tid % U(WARP)
            return warp, lane // U(4), lane % U(4), lane

        @cuda.jit(device=True)
        def b_address(base, b_at):
            """The thread's byte address for B at element offset b_at (see _b_loads)."""
            warp, g, t, lane = thread_parts()
            if W is None:
                part = U(8) * g + U(2) * t
            else:
                q, r = lane // U(8), lane % U(8)
                part = ((q % U(2)) * U(W // 8) + q // U(2)) * U(64) + U(8) * r
            return uint32(base + U(2) * (U(b_at) + part))     # (Numba widens u32 sums)

        @cuda.jit(device=True)
        def mma_ss(sh, a_at, b_at):
            base = shared_address(sh)
            warp, g, t, lane = thread_parts()
            a_addr = uint32(base + U(2) * (U(a_at) + U(2) * warp * U(KA // 8) * U(64)
                                           + U(8) * g + U(2) * t))
            return ss(a_addr, b_address(base, b_at))

        @cuda.jit(device=True)
        def rs_descriptor(sh, b_at):
            return b_address(shared_address(sh), b_at)

        @cuda.jit(device=True)
        def rs_issue(sh, sm, acc, a, b_addr, scratch):
            rs(acc, a, b_addr)

        @cuda.jit(device=True)
        def mma_rs(sh, sm, acc, a, b_at, scratch):
            rs(acc, a, b_address(shared_address(sh), b_at))
        return dict(mma_ss=mma_ss, mma_rs=mma_rs, ss_issue=mma_ss, rs_issue=rs_issue,
                    rs_descriptor=rs_descriptor, regs=n // 2)

    @functools.lru_cache(maxsize=None)
    def make_wait(pending, acc_regs):
        """(wait_s, wait_acc): pass-throughs, mma.sync's results being in registers."""
        @device_function
        def wait_s(s):
            return s

        @device_function
        def wait_acc(acc):
            pass
        return wait_s, wait_acc


def engine(name, wgmma):
    """The products a 16-bit kernel issues, by engine name: "wgmma" (sm_90a: `wgmma`, the
    caller's (products16, make_wait, fence) from wgmma16 and wgmma: the async proxy fence, dQ
    added two columns at a time by red.global.add.v2.f32, sm_90's) or "mma" (sm_80+: this
    module's mma.sync products, no fence, dQ by scalar atomics). The caller passes the wgmma
    functions it imported, so that a mutant of wgmma16 (testing.mutants, which substitutes a
    kernel module's names) reaches them. A namespace: products16, make_wait, fence,
    vector_dq, stmatrix (whether 16-bit tiles may be stored by stmatrix, sm_90's)."""
    if name == "wgmma":
        products16_, make_wait_, fence = wgmma
        return SimpleNamespace(name=name, products16=products16_, make_wait=make_wait_,
                               fence=fence, vector_dq=True, stmatrix=True)
    if name == "mma":
        return SimpleNamespace(name=name, products16=products16, make_wait=make_wait,
                               fence=no_fence, vector_dq=False, stmatrix=False)
    raise ValueError(f"engine must be 'wgmma' or 'mma', got {name!r}")
