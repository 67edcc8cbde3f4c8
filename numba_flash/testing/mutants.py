"""Deliberately broken kernels, made by editing one line of a real kernel's source.

Each mutant names the kernel module, the exact line fragment it changes and what it becomes,
and the registered pair it is a mutant of; `registered(name)` compiles the edited module (and
`via`, the module that imports from it and gives the pair's part, against the edited one) and
registers a copy of the pair with that part replaced, for the duration of a `with` block. The
property suite must catch every mutant (tests/test_mutants.py), which is the evidence that it
has teeth. A mutant whose fragment no longer occurs in the source fails loudly, so a refactor
cannot silently disarm it.
"""

import contextlib
import importlib
import inspect
import types
from dataclasses import dataclass

from .. import kernels, registry

SIM = "simulator"


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: str          # "forward" or "backward": the half of the pair it breaks
    module: str        # module in numba_flash.kernels
    original: str      # fragment of one line, must occur exactly once
    mutated: str
    prop: str          # the property expected to catch it
    base: str          # the registered pair it is a mutant of
    via: str = None    # the module giving the pair's part, if not `module` (it imports `module`)
    # strategies.SIZES: "simulator-wide" for the d > 64 kernels, "simulator-blocks" for what
    # shows only past the Hopper family's first 64 keys
    size: str = SIM
    # the edit is in a simulator model of a tensor-core instruction (wgmma16's), or rounds
    # through NumPy's float16 (what a careless half kernel holds a value in), which only the
    # simulator can run: on a GPU the instruction runs unedited, or the edit does not compile
    simulator_only: bool = False
    # the regimes the search draws (None: all), for a mutant that only some regimes expose by
    # design (a short derandomized search may not draw them, a fuzz run does): "rising keys"
    # for the rescale mutants (every block moves every row's max; with "huge" only some rows'
    # did, caught at the 6th to 8th example, 20-70 s of CI each, 2026-12-06); O held in
    # float16 errs within the half tolerance until it overflows, which is what "large v" is
    # for; S held in float16 is exact enough until it passes 65504 ("huge"); dS held in
    # float16 is more precise than bfloat16 until it falls into float16's subnormals, which
    # is what "tiny dO" is for
    regimes: tuple = None
    # the input dtypes the search draws (None: all), for the edits that round through
    # float16: S or O held in float16 shows with float16 inputs; dS held in float16 with
    # bfloat16 ones, whose tiny gradients float16's subnormals lose (with float16 inputs the
    # kernel's own dS is float16: 40 examples found nothing, 2026-12-06)
    dtypes: tuple = None


_R = "forward agrees"
_B = "backward agrees"
MUTANTS = {m.name: m for m in (
    Mutant("l not rescaled when m grows", "forward", "forward_rowwise",
           "l *= alpha", "l *= T(1.0)", _R, "rowwise"),
    Mutant("O not rescaled when m grows", "forward", "forward_rowwise",
           "o_i[c] *= alpha", "o_i[c] *= T(1.0)", _R, "rowwise"),
    Mutant("l not rescaled (tiled)", "forward", "forward_tiled",
           "l_row[r] = alpha_row[r] * l_row[r] + l_sum", "l_row[r] = l_row[r] + l_sum", _R,
           "tiled"),
    Mutant("causal offset off by one", "forward", "forward_tiled",
           "j + nq > m0 + r + nk", "j + nq >= m0 + r + nk", _R, "tiled"),
    Mutant("last partial tile dropped", "forward", "forward_tiled",
           "while n0 < n_end:", "while n0 + uBN <= n_end:", _R, "tiled"),
    Mutant("l not rescaled (fa2)", "forward", "forward_fa2",
           "l[a] = alpha * l[a] + row_sum", "l[a] = l[a] + row_sum", _R, "fa2"),
    Mutant("row max from this thread's columns only (fa2)", "forward", "forward_fa2",
           "m_new = max(m_new, sm[uR + r * uRR + U(t)])",
           "m_new = max(m_new, sm[uR + r * uRR + tx])", _R, "fa2"),
    Mutant("max not guarded on fully masked rows", "forward", "forward_rowwise",
           "m_safe = m_new if m_new != T(NEG_INF) else T(0.0)", "m_safe = m_new", _R,
           "rowwise"),
    Mutant("D left out of dS", "backward", "backward",
           "p * (dp[a, b] - D_t[r])", "p * dp[a, b]", _B, "tiled"),
    Mutant("D left out of dS^T (fa2)", "backward", "backward_fa2",
           "ds = p * (dp[a, b] - sm[uDv + il])", "ds = p * dp[a, b]", _B, "fa2"),
    Mutant("dQ added without scale (fa2)", "backward", "backward_fa2",
           "dq_acc[a, e * CHUNK + cc] * scale)", "dq_acc[a, e * CHUNK + cc])", _B, "fa2"),
    Mutant("P recomputed without lse", "backward", "backward",
           "p = math.exp(s[a, b] - lse_i)", "p = math.exp(s[a, b])", _B, "tiled"),
    # the Hopper family (sm90): its online softmax, the lean forward's O, the backward's dS,
    # the permuted contraction in one direction only, a dQ pair's columns
    Mutant("l not rescaled (wgmma)", "forward", "sm90.softmax",
           "l[h] *= alpha[h]", "l[h] *= float32(1.0)", _R, "wgmma", via="sm90.forward",
           size="simulator-blocks", regimes=("rising keys",)),
    Mutant("O not rescaled (wgmma)", "forward", "sm90.forward",
           "o_acc[j] *= alpha[(j % 4) // 2]", "o_acc[j] *= float32(1.0)", _R, "wgmma",
           size="simulator-blocks", regimes=("rising keys",)),
    # the blocks the float32 forward leaves unmasked (every key visible to every row)
    Mutant("every block left unmasked (wgmma)", "forward", "sm90.forward",
           "masked = n1 > nk or (causal and n1 - U(1) + nq > row0 + nk)", "masked = False",
           _R, "wgmma"),
    Mutant("every block left unmasked (wgmma, d > 64)", "forward", "sm90.forward",
           "masked = n0 + uBN > nk or (causal and n0 + U(BLOCK - 1) + nq > row0 + nk)",
           "masked = False", _R, "wgmma", size="simulator-wide"),
    # (the causal half shows only past the first 64 keys; its off-by-ones are the fixed cases
    # of tests/test_forward_wgmma.py)
    Mutant("causal blocks left unmasked (wgmma)", "forward", "sm90.forward",
           "masked = n1 > nk or (causal and n1 - U(1) + nq > row0 + nk)", "masked = n1 > nk",
           _R, "wgmma", size="simulator-blocks"),
    Mutant("D left out of dS (wgmma)", "backward", "sm90.backward",
           "dp_acc[j] = p * (dp_acc[j] - (D1 if hi else D0))", "dp_acc[j] = p * dp_acc[j]",
           _B, "wgmma"),
    Mutant("dQ pair added to swapped columns (wgmma)", "backward", "sm90.backward",
           "x0, x1 = dq_acc[4 * nt + b] * scale, dq_acc[4 * nt + 2 + b] * scale",
           "x1, x0 = dq_acc[4 * nt + b] * scale, dq_acc[4 * nt + 2 + b] * scale", _B, "wgmma",
           size="simulator-wide"),
    Mutant("K unpermuted in the backward only (wgmma, d > 64)", "backward", "sm90.backward",
           "stage = make_stage(False, per_warpgroup=True, chain_permuted=True)",
           "stage = make_stage(False, per_warpgroup=True, chain_permuted=False)", _B, "wgmma",
           size="simulator-wide"),
    # the 16-bit pair (sm90.forward16): S scaled in the exponent, the lazy reference max, P
    # packed two keys to a register, O rescaled in the tensor core's accumulator; and what a
    # careless half kernel does, holding S or O in float16 (wgmma's .f16 accumulators: S past
    # 65504 is inf, the unnormalized O sums up to Nk values of |v|), edited into the
    # simulator's model of the products (wgmma16.py)
    Mutant("S not scaled in the exponent (wgmma16)", "forward", "sm90.softmax",
           "p = exp2_approx(s_acc[j] * c - m_safe[h])", "p = exp2_approx(s_acc[j] - m_safe[h])",
           _R, "wgmma16", via="sm90.forward16"),
    Mutant("reference max kept however far a row max passes it (wgmma16)", "forward",
           "sm90.forward16", "tau = min(float32(LAZY_LOG2) / scale_log2, float32(FLT_MAX))",
           "tau = float32(FLT_MAX)", _R, "wgmma16", size="simulator-blocks",
           regimes=("rising keys",)),
    Mutant("P's keys swapped in pairs (wgmma16)", "forward", "sm90.forward16",
           "p_regs[w] = pack(s_acc[2 * w], s_acc[2 * w + 1])",
           "p_regs[w] = pack(s_acc[2 * w + 1], s_acc[2 * w])", _R, "wgmma16"),
    # (O is rescaled only when the lazy max moves, a row max passing it by 2^8 in P: logits
    # far apart across blocks, which the rising keys regime draws at once)
    Mutant("O not rescaled (wgmma16)", "forward", "sm90.forward16",
           "o_acc[j] *= alpha[(j % 4) // 2]", "o_acc[j] *= float32(1.0)", _R, "wgmma16",
           size="simulator-blocks", regimes=("rising keys",)),
    Mutant("S held in float16 (wgmma16)", "forward", "sm90.wgmma16",
           "return exact.astype(np.float32)", "return exact.astype(np.float16)", _R, "wgmma16",
           via="sm90.forward16", simulator_only=True, regimes=("huge",), dtypes=("float16",)),
    Mutant("O accumulated in float16 (wgmma16)", "forward", "sm90.wgmma16",
           "acc[j] = float32(np.float64(acc[j]) + exact[j])",
           "acc[j] = float32(np.float16(np.float64(acc[j]) + exact[j]))", _R, "wgmma16",
           via="sm90.forward16", simulator_only=True, regimes=("large v",),
           dtypes=("float16",)),
    # Not a mutant here: "the rescale done in half" (o_acc[j] rounded to float16 as it is
    # multiplied by alpha in forward16) survives a search, and is no bug by the tolerance
    # rule: the lazy max rescales O only when alpha <= 2^-8, so the rounding errs within
    # float16's own (2026-12-07, float16 inputs: 40 'rising keys' examples and 80 over every
    # regime, searched as the mutants are, none failed; 60 fuzz examples, worst 0.34 of the
    # allowance), and the rescaled O overflows only past 256 keys at the old max with |v|
    # near 65504, beyond the simulator's sizes. O held in float16 throughout, the careless
    # kernel that does overflow, is the mutant above.
    Mutant("P rounded to float16 before the max is subtracted (wgmma16)", "forward",
           "sm90.softmax", "p = exp2_approx(s_acc[j] * c - m_safe[h])",
           "p = float32(__import__('numpy').float16(exp2_approx(s_acc[j] * c))) "
           "* exp2_approx(-m_safe[h])", _R, "wgmma16", via="sm90.forward16",
           simulator_only=True),
    # its pipeline (two stages of K/V, cp.async; on the simulator the copies land at once, so
    # staging the next block over this one replaces the tile before its products read it) and
    # the blocks it leaves unmasked
    Mutant("next K/V block staged over this one (wgmma16)", "forward", "sm90.forward16",
           "stage_block(sh, U(KV_AT) + (b + U(1)) % U(STAGES) * U(2 * TILE)",
           "stage_block(sh, U(KV_AT) + b * U(2 * TILE)", _R, "wgmma16", size="simulator-blocks"),
    Mutant("every block left unmasked (wgmma16)", "forward", "sm90.forward16",
           "masked = n1 > nk or (causal and n1 - U(1) + nq > row0 + nk)", "masked = False",
           _R, "wgmma16"),
    # the 16-bit backward (sm90.backward16)
    Mutant("dS held in float16 (wgmma16)", "backward", "sm90.backward16",
           "words_ds[w] = pack(dpt[2 * w], dpt[2 * w + 1])",
           "words_ds[w] = pack(float32(__import__('numpy').float16(dpt[2 * w])), "
           "float32(__import__('numpy').float16(dpt[2 * w + 1])))", _B, "wgmma16",
           simulator_only=True, regimes=("tiny dO",), dtypes=("bfloat16",)),
    Mutant("next Q block staged over this one (wgmma16)", "backward", "sm90.backward16",
           "at = U(QDO_AT) + (b ^ U(1)) * U(2 * TILE)",
           "at = U(QDO_AT) + b * U(2 * TILE)", _B, "wgmma16",
           size="simulator-blocks"),
    Mutant("dS matrices stored at the wrong keys (wgmma16)", "backward", "sm90.backward16",
           "warp * U(16) + (m % U(2)) * U(8)", "warp * U(16) + (m // U(2)) * U(8)", _B,
           "wgmma16"),
    Mutant("queries past nq taken as visible (wgmma16)", "backward", "sm90.backward16",
           "if VISIBLE_STEPS and m0 + uBM <= nq and n0 + uBM <= nk and",
           "if VISIBLE_STEPS and m0 <= nq and n0 + uBM <= nk and", _B, "wgmma16",
           size="simulator-blocks"),
    Mutant("the next query head never taken (wgmma16)", "backward", "sm90.backward16",
           "if m1 == m_end:", "if m1 > m_end:", _B, "wgmma16", size="simulator-gqa"),
    Mutant("D left out of dS (wgmma16)", "backward", "sm90.backward16",
           "dpt[jj] = p * (dp[jj] - sm[U(DSUM_AT) + c])", "dpt[jj] = p * dp[jj]", _B,
           "wgmma16"),
    Mutant("dS of both warpgroups in one place (wgmma16)", "backward", "sm90.backward16",
           "key = wg * uBM + warp * U(16)", "key = warp * U(16)", _B, "wgmma16",
           size="simulator-blocks"),
    # (the scale handed to both ways of adding dQ: the pairs of columns, which aligned inputs
    # take, and the scalar atomics, and to every block's, pipelined or not; an edit of the
    # scalar line alone took 132 s of search on the simulator to meet a misaligned case,
    # 2026-12-04)
    Mutant("dQ added without scale (wgmma16)", "backward", "sm90.backward16",
           "dq_scale = scale", "dq_scale = float32(1.0)", _B, "wgmma16"),
    # at D = 64 a block's dQ product is waited for in the next step; the last one after the
    # loop (a K/V block's whole dQ share of its last Q block lost without it)
    Mutant("the last Q block's dQ never added (wgmma16)", "backward", "sm90.backward16",
           "if PIPELINED and total > U(0):", "if PIPELINED and total < U(0):", _B,
           "wgmma16"),
)}


def _load(name, source, file, package, label):
    mod = types.ModuleType(f"{name}_mutant")
    mod.__package__ = package
    mod.__file__ = file
    exec(compile(source, label, "exec"), mod.__dict__)
    return mod


def build(mutant):
    """The kernel module with the mutant's edit applied, as a fresh module object; with
    `via`, a fresh copy of that module whose names from the edited one are the mutant's."""
    module = importlib.import_module(f"{kernels.__name__}.{mutant.module}")
    source = inspect.getsource(module)
    count = source.count(mutant.original)
    if count != 1:
        raise RuntimeError(f"mutant {mutant.name!r}: {mutant.original!r} occurs {count} times "
                           f"in {module.__name__}; update the mutant")
    label = f"<mutant {mutant.name}: {module.__name__}>"
    mod = _load(module.__name__, source.replace(mutant.original, mutant.mutated),
                module.__file__, module.__package__, label)
    if mutant.via is None:
        return mod
    via = importlib.import_module(f"{kernels.__name__}.{mutant.via}")
    fresh = _load(via.__name__, inspect.getsource(via), via.__file__, via.__package__, label)
    for name, value in vars(fresh).items():       # what it took from the edited module
        if getattr(module, name, None) is value and hasattr(mod, name):
            setattr(fresh, name, getattr(mod, name))
    return fresh


def _part(mutant, mod):
    """The pair field the mutant replaces, from the edited module."""
    if mutant.kind == "forward":
        return dict(make_forward=mod.make_forward_kernel)
    if mutant.base in ("wgmma", "wgmma16"):
        return dict(run_backward=mod.run_backward)
    if mutant.base == "fa2":
        def run(*args, deterministic, **kw):
            mod.run_backward(*args, dq_atomic=not deterministic, **kw)
    else:
        def run(*args, deterministic, **kw):
            mod.run_backward(*args, **kw)
    return dict(run_backward=run)


@contextlib.contextmanager
def registered(name):
    """Register mutant `name` as a kernel pair (its base pair with the broken part); yields
    the pair's name."""
    mutant = MUTANTS[name]
    pair = registry.register(registry.variant(f"mutant: {name}", mutant.base,
                                              **_part(mutant, build(mutant))))
    try:
        yield pair.name
    finally:
        registry.unregister(pair.name)
