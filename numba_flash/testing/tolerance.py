"""Tolerance relative to what the precision allows (DESIGN.md).

Truth is computed one precision above the kernel's: float64 for float32 kernels, long double
(80-bit on x86) for float64 kernels. forward_truth/backward_truth compute it once for every
kernel run on the same inputs, the float64 one on a GPU if asked (truth.py; same formulas,
same rule). A kernel passes when its max error against truth is at
most `multiple` times the error of plain NumPy attention in the kernel's precision on the same
inputs (2x forward, 3x gradients), plus a rounding floor of FLOOR_ULPS units of roundoff
times the largest truth value. NaN never passes; the -inf pattern of lse must match exactly.

The forward's floor also covers the logits' own rounding. S_ij = scale q_i.k_j is a d-term sum,
and a correct kernel may add it in another order than NumPy's BLAS: in any order it can be off
by a few units of roundoff of its terms, scale sum_d |q_id k_jd|, which can be far larger than
S itself (terms of +-900 that cancel to 1, or one term of 1e3 beside a hundred of 0.1). lse
moves with S one for one (d lse / d S_ij = P_ij, summing to 1) and out_i by at most the spread
of v's column (d out_i / d S_ij = P_ij (v_j - out_i), and out_i lies among the v_j), so the floor
adds S_ROUNDING_ULPS units of the largest term sum to lse's and that times the largest spread
max_j v_jc - min_j v_jc to out's. Without it, head-dim-order kernels failed
on the GPU at 1.5x the allowed error in the near-cancelling and row-offset regimes
(tests/test_tolerance.py replays both in NumPy).

The backward adds what the FlashAttention algorithm itself rounds and NumPy's materialized
softmax does not: P is recomputed as exp(S - lse) from an lse stored in the kernel's precision.
S is recomputed exactly as the forward computed it, so its own rounding is shared with lse and
cancels in S - lse; what remains is the rounding of lse and of the subtraction, a unit of
roundoff each at |lse|. So P is off by up to S_ROUNDING_ULPS units of max |lse| relative, and
each gradient's floor adds that times its terms. At logits of order 1 (|lse| ~ 10) this about
doubles the floor; with rows offset by 1e3 (|lse| ~ 1e3) the kernels' dk was off by 1e-4
relative, 9x what the floor without it allowed (gpu fuzz, 2026-11-29; tests/test_tolerance.py).

The backward also allows for the rounding of dS = P (dP - D)'s inputs. D_i = rowsum(dO_i * O_i)
is computed from the forward's O, which a correct forward may return a unit of roundoff or a
few off NumPy's, and dP_ij rounds too; with one dominant key dP_ij - D_i cancels to ~0 and those
units are all that is left of it, while the floor above follows |dS| ~ 0. And the logits'
rounding reaches the gradients: S_ij off by up to s_err (the forward's allowance) moves P_ij by
up to 2 s_err relative (its own logit and its row's lse) and D_i with it. So dq's and dk's
floors add D_ROUNDING_ULPS units of roundoff plus 2 s_err of their sums taken over
P_ij (|dP_ij| + |D_i|) instead of |dS_ij|, and dv's adds 2 s_err of its terms. Without the
first, the float64 fa2 backward failed at 1.9x (dk 7.6e-14 against 3.9e-14; dominant key;
gpu properties, 2026-11-29), as does the NumPy FlashAttention backward fed an O one unit of
roundoff off; without the second, the float32 fa2-atomic backward at 1.03x (dk 1.51e-3 against
1.47e-3; row offsets, d = 186), and gradients computed exactly from logits summed in the
kernels' order make nearly those errors (tests/test_tolerance.py replays both in NumPy).
These allowances are worst cases (every logit's rounding aligned): on 40 x 50 x 64 problems they
allow 2-4x what the rule allowed without them for ordinary and row-offset logits, and 40-450x
for dq and dk where the gradients cancel (dominant key: their true values are ~0; near-
cancelling logits: S itself is uncertain by s_err). Propagating s_err through dS with its
signs would be tighter there.
"""

from dataclasses import dataclass

import numpy as np

import reference as ref

from . import truth as truth_mod

FORWARD_MULTIPLE = 2.0
GRADIENT_MULTIPLE = 3.0
FLOOR_ULPS = 16
S_ROUNDING_ULPS = 2
D_ROUNDING_ULPS = 2
HALF_FLOOR_ULPS = 1          # of a half format's eps (two units of roundoff): see half_format


# Half kernels are held to the same rule against float64 truth of the same half inputs, with
# two changes (issue 24, FlashAttention's rule): "plain attention in the kernel's precision" is
# standard attention stored in half (reference.half: S, P, out, dP, dS rounded to the format),
# and the floor is HALF_FLOOR_ULPS of the format's eps at the largest truth value (out and the
# gradients are rounded to it once; FLOOR_ULPS of it would allow 12 % in bfloat16) plus
# float32's floor at the terms' size (_floor). What the kernels compute in float32 (S, lse, P
# before its rounding, D) keeps float32's allowances (logit_rounding and the backward's
# extras, from the float32 values).
half_format = ref.precision.half_format


def _floor(dtype, largest, terms):
    """The rounding floor: FLOOR_ULPS of the dtype's eps times the larger of the largest truth
    value and the terms' size; for a half format, HALF_FLOOR_ULPS of its eps times the largest
    truth value (the output's one rounding to the format) plus float32's floor for the sums
    the kernel adds in float32."""
    fmt = half_format(dtype)
    if fmt:
        return (HALF_FLOOR_ULPS * 2 * ref.precision.HALF_UNIT_ROUNDOFF[fmt] * largest
                + FLOOR_ULPS * float(np.finfo(np.float32).eps) * max(largest, terms))
    return FLOOR_ULPS * float(np.finfo(dtype).eps) * max(largest, terms)


@dataclass(frozen=True)
class Comparison:
    """One output array against truth."""
    name: str
    max_err: float
    mean_err: float
    allowed: float
    ok: bool
    note: str = ""

    def __str__(self):
        mark = "ok" if self.ok else "FAIL"
        return (f"{self.name}: max err {self.max_err:.3e} (mean {self.mean_err:.3e}), allowed "
                f"{self.allowed:.3e} {mark}{' - ' + self.note if self.note else ''}")


def truth_dtype(dtype):
    """One precision up: long double for float64, float64 for float32 and the half formats."""
    return np.longdouble if np.dtype(dtype) == np.float64 else np.float64


def compare(name, got, truth, same_precision, multiple, dtype, terms=0.0, extra=0.0):
    """Compare `got` (kernel) and `same_precision` (NumPy in the kernel's dtype) with truth.

    Entries where truth is -inf (lse of fully masked rows) must be -inf in `got`; the rest
    are compared by absolute error. `terms` is the size of the terms each entry sums (e.g.
    max_i sum_j |dS_ij| |k| for dq): the rounding floor is relative to the larger of it and
    the largest truth value, so results that cancel to ~0 are not held to 0's ulp. `extra` is
    added to the floor as it is (the logits' rounding, see the module docstring)."""
    got = np.asarray(got, dtype=np.float64)
    truth = np.asarray(truth)
    same = np.asarray(same_precision)
    if np.isnan(got).any():
        return Comparison(name, np.nan, np.nan, 0.0, False, f"{int(np.isnan(got).sum())} NaN")
    masked = np.isneginf(truth)
    if not np.array_equal(np.isneginf(got), masked):
        return Comparison(name, np.inf, np.inf, 0.0, False, "-inf pattern differs from truth")
    fin = ~masked
    if not np.isfinite(got[fin]).all():
        return Comparison(name, np.inf, np.inf, 0.0, False, "inf where truth is finite")
    if not fin.any():
        return Comparison(name, 0.0, 0.0, 0.0, True)
    err = np.abs(got[fin] - truth[fin]).astype(np.float64)
    same_err = np.abs(same[fin].astype(truth.dtype) - truth[fin]).astype(np.float64)
    largest = max(float(np.abs(truth[fin]).max()), np.finfo(np.float64).tiny)
    floor = _floor(dtype, largest, float(terms)) + extra
    allowed = multiple * float(np.nan_to_num(same_err.max(), posinf=0.0)) + floor
    return Comparison(name, float(err.max()), float(err.mean()), allowed,
                      bool(err.max() <= allowed))


def expand_kv(q, k, v):
    """Repeat GQA key heads so the reference sees identical leading dims."""
    if k.ndim == 4 and k.shape[1] != q.shape[1]:
        return ref.repeat_kv(k, q.shape[1]), ref.repeat_kv(v, q.shape[1])
    return k, v


def _truth_in(ns, hi):
    """The namespace truth of dtype `hi` is computed in: `ns` for float64 (a GPU's, see
    truth.namespace), NumPy for long double, which GPUs do not have."""
    return ns if ns is not None and np.dtype(hi) == np.float64 else truth_mod.NUMPY


@dataclass(frozen=True)
class ForwardTruth:
    """What check_forward compares a forward's (out, lse) with, for one (q, k, v): truth one
    precision up, NumPy's attention in the kernels' precision, and the rounding allowances'
    sizes. Computed once (forward_truth), it serves every kernel run on those inputs."""
    dtype: np.dtype
    out: np.ndarray
    lse: np.ndarray
    same_out: np.ndarray
    same_lse: np.ndarray
    v_max: float
    v_spread: float
    s_err: float


def forward_truth(q, k, v, *, causal=False, scale=None, ns=None):
    """ForwardTruth of (q, k, v). ns: a truth.Namespace to compute float64 truth in (the
    GPU's: truth.namespace()); default NumPy. The rule is the same either way."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    dtype, fmt = q.dtype, half_format(q.dtype)
    if fmt:                                 # their values, in float32 (what the kernels use)
        q, k, v = (a.astype(np.float32) for a in (q, k, v))
    k, v = expand_kv(q, k, v)
    hi = truth_dtype(dtype)
    t_out, t_lse = truth_mod.attention_forward(q.astype(hi), k.astype(hi), v.astype(hi),
                                               causal=causal, scale=scale, ns=_truth_in(ns, hi))
    with np.errstate(over="ignore"):
        if fmt:
            p_out, p_lse = ref.attention_forward_half(q, k, v, fmt, causal=causal, scale=scale)
        else:
            p_out, p_lse = ref.attention_forward(q, k, v, causal=causal, scale=scale)
    # out_i = sum_j P_ij v_j with sum_j P_ij = 1: its terms are at most max |v|
    v_max = float(np.abs(v).max(initial=0.0))
    v_spread = float((v.max(axis=-2) - v.min(axis=-2)).max()) if v.size else 0.0
    return ForwardTruth(dtype, t_out, t_lse, p_out, p_lse, v_max, v_spread,
                        logit_rounding(q, k, scale))


def check_forward(q, k, v, out, lse, *, causal=False, scale=None, truth=None):
    """[Comparison(out), Comparison(lse)] of a kernel's forward against truth. truth: a
    ForwardTruth of these inputs (forward_truth), to share between kernels; default computed
    here, in NumPy."""
    t = truth if truth is not None else forward_truth(q, k, v, causal=causal, scale=scale)
    lse_dtype = np.float32 if half_format(t.dtype) else t.dtype    # half kernels: float32 lse
    return [compare("out", out, t.out, t.same_out, FORWARD_MULTIPLE, t.dtype, terms=t.v_max,
                    extra=t.v_spread * t.s_err),
            compare("lse", lse, t.lse, t.same_lse, FORWARD_MULTIPLE, lse_dtype, extra=t.s_err)]


def logit_rounding(q, k, scale=None):
    """S_ROUNDING_ULPS units of roundoff of the largest logit term sum,
    scale * max_ij sum_d |q_id| |k_jd| (k already has q's heads): how far rounding alone may
    move a logit in a summation order other than NumPy's (module docstring)."""
    if q.size == 0 or k.size == 0:
        return 0.0
    s = ref.default_scale(q.shape[-1], scale)
    a, b = np.abs(q).astype(np.float64), np.abs(k).astype(np.float64)
    terms = float((a @ np.swapaxes(b, -1, -2)).max()) * s
    return S_ROUNDING_ULPS * float(np.finfo(q.dtype).eps) * terms


@dataclass(frozen=True)
class BackwardTruth:
    """What check_backward compares (dq, dk, dv) with, for one (dout, q, k, v): truth one
    precision up and NumPy's in the kernels' precision (dk, dv summed over GQA groups), and
    each gradient's term size and extra floor (_gradient_terms)."""
    dtype: np.dtype
    grads: tuple
    same: tuple
    terms: tuple
    extras: tuple


def backward_truth(dout, q, k, v, *, causal=False, scale=None, ns=None):
    """BackwardTruth of (dout, q, k, v); ns as in forward_truth."""
    dout, q, k, v = (np.asarray(a) for a in (dout, q, k, v))
    dtype, fmt = q.dtype, half_format(q.dtype)
    if fmt:                                 # their values, in float32 (what the kernels use)
        dout, q, k, v = (a.astype(np.float32) for a in (dout, q, k, v))
    kv_heads = k.shape[1] if k.ndim == 4 else None
    k, v = expand_kv(q, k, v)
    hi = truth_dtype(dtype)
    truth = truth_mod.attention_backward(dout.astype(hi), q.astype(hi), k.astype(hi),
                                         v.astype(hi), causal=causal, scale=scale,
                                         ns=_truth_in(ns, hi))
    with np.errstate(over="ignore", invalid="ignore"):
        if fmt:
            same = ref.attention_backward_half(dout, q, k, v, fmt, causal=causal, scale=scale)
        else:
            same = ref.attention_backward(dout, q, k, v, causal=causal, scale=scale)
    if kv_heads is not None and kv_heads != q.shape[1]:
        truth = (truth[0],) + tuple(ref.sum_kv_groups(g, kv_heads) for g in truth[1:])
        same = (same[0],) + tuple(ref.sum_kv_groups(g, kv_heads) for g in same[1:])
    terms, extras = _gradient_terms(dout, q, k, v, causal, scale, kv_heads, fmt)
    return BackwardTruth(dtype, tuple(truth), tuple(same), tuple(terms), tuple(extras))


def check_backward(dout, q, k, v, dq, dk, dv, *, causal=False, scale=None, truth=None):
    """[Comparison(dq), Comparison(dk), Comparison(dv)] against truth; under GQA the truth
    of dk and dv sums over the query heads that share a key head. truth: a BackwardTruth of
    these inputs (backward_truth), to share between kernels; default computed here, in NumPy."""
    t = truth if truth is not None else backward_truth(dout, q, k, v, causal=causal,
                                                       scale=scale)
    return [compare(name, got, g, s, GRADIENT_MULTIPLE, t.dtype, terms=m, extra=e)
            for name, got, g, s, m, e in zip(("dq", "dk", "dv"), (dq, dk, dv), t.grads,
                                             t.same, t.terms, t.extras)]


def allowed_forward(q, k, v, *, causal=False):
    """[allowed for out, allowed for lse]: what check_forward holds a kernel's forward on
    these inputs to, without a kernel run (truth compared with itself: its allowances do not
    depend on the kernel's values)."""
    t = forward_truth(q, k, v, causal=causal)
    return [c.allowed for c in check_forward(q, k, v, t.out, t.lse, truth=t)]


def allowed_backward(dout, q, k, v, *, causal=False):
    """[allowed for dq, dk, dv]: as allowed_forward, check_backward's allowances."""
    t = backward_truth(dout, q, k, v, causal=causal)
    return [c.allowed for c in check_backward(dout, q, k, v, *t.grads, truth=t)]


def reference_p_dp(q, k, v, dout, causal=False, scale=None, dtype=np.float64):
    """P = softmax(scale q k^T) (masked) and dP = dO v^T in `dtype`; k and v already have q's
    heads (see expand_kv)."""
    return _reference_s_p_dp(q, k, v, dout, causal, scale, dtype)[1:]


def _reference_s_p_dp(q, k, v, dout, causal, scale, dtype):
    """(S, P, dP) in `dtype`: S = scale q k^T with -inf where masked, P = softmax(S)."""
    q, k, v, dout = (a.astype(dtype) for a in (q, k, v, dout))
    S = (q @ np.swapaxes(k, -1, -2)) * dtype(ref.default_scale(q.shape[-1], scale))
    if causal:
        S = np.where(ref.causal_mask(q.shape[-2], k.shape[-2]), S, -np.inf)
    return S, ref.safe_softmax(S), dout @ np.swapaxes(v, -1, -2)


def _gradient_terms(dout, q, k, v, causal, scale, kv_heads=None, fmt=None):
    """(terms, extras) for dq, dk, dv. terms: sizes of the sums behind them (float64): dq_i =
    scale sum_j dS_ij k_j, dk_j = scale sum_i dS_ij q_i (summed over the query heads sharing
    key head j under GQA), dv_j = sum_i P_ij dO_i. Rows of dS sum to zero, so dq can cancel to
    ~0 while its terms do not; the rounding floor follows the terms. extras: the rounding of P
    recomputed from lse, and that of dS = P (dP - D)'s inputs (module docstring); for a half
    format `fmt`, also D_i = rowsum(dO_i * O_i) taken from the forward's O rounded to that
    format (FlashAttention's contract: out is stored in half): off by up to u sum_c |dO_ic|
    |O_ic| (u its unit roundoff), which reaches dq_i as scale sum_j P_ij dD_i |k_j| and dk_j
    alike. Without it, float16 kernels computing in float32 failed with dO ~ 2e3 or |v| ~ 6e4
    (gpu fuzz, 2026-12-04: dq off by 0.214 against 0.039 allowed, all of it this rounding,
    tests/test_tolerance.py replays it in NumPy)."""
    s = ref.default_scale(q.shape[-1], scale)
    S, P, dP = _reference_s_p_dp(q, k, v, dout, causal, scale, np.float64)
    D = (P * dP).sum(axis=-1, keepdims=True)
    q_max, k_max = float(np.abs(q).max()), float(np.abs(k).max())

    def dq_dk_sizes(x):
        """scale max_i sum_j |x_ij| k_max and scale max_j sum_i |x_ij| q_max (GQA-summed)."""
        dk_sums = np.abs(x).sum(axis=-2)             # (..., H, Nk)
        if kv_heads is not None and kv_heads != q.shape[1]:
            dk_sums = ref.sum_kv_groups(dk_sums[..., None], kv_heads)
        return s * np.abs(x).sum(axis=-1).max() * k_max, s * dk_sums.max() * q_max

    terms = dq_dk_sizes(P * (dP - D)) + (P.sum(axis=-2).max() * float(np.abs(dout).max()),)
    eps = float(np.finfo(q.dtype).eps)
    # lse_i = m_i - log(max_j P_ij), since the largest P_ij is exp(m_i - lse_i): no second pass
    m, p_max = S.max(axis=-1), P.max(axis=-1)
    seen = p_max > 0                                 # rows with a visible key
    lse = m[seen] - np.log(p_max[seen])
    p_err = S_ROUNDING_ULPS * eps * float(np.abs(lse).max(initial=0.0))
    # dS_ij's inputs, dP_ij and D_i: each off by D_ROUNDING_ULPS units of roundoff, and by
    # 2 s_err relative through P (the logits' rounding: S_ij and its row's lse), at the size of
    # P_ij (|dP_ij| + |D_i|), which is not small where dP_ij - D_i cancels
    s_err = logit_rounding(q, k, scale)
    ds_err = D_ROUNDING_ULPS * eps + 2 * s_err
    dq_ds, dk_ds = dq_dk_sizes(P * (np.abs(dP) + np.abs(D)))
    # and every gradient: P = exp(S - lse) off by p_err relative (dv: and by 2 s_err)
    extras = [p_err * terms[0] + ds_err * dq_ds, p_err * terms[1] + ds_err * dk_ds,
              (p_err + 2 * s_err) * terms[2]]
    if fmt:
        O = P @ v.astype(np.float64)
        dD = (ref.precision.HALF_UNIT_ROUNDOFF[fmt]
              * (np.abs(dout.astype(np.float64)) * np.abs(O)).sum(axis=-1, keepdims=True))
        dq_dd, dk_dd = dq_dk_sizes(P * dD)
        extras[0] += dq_dd
        extras[1] += dk_dd
    return terms, tuple(extras)


def assert_within_tolerance(comparisons, problem=""):
    """AssertionError listing every comparison when any fails."""
    if not all(c.ok for c in comparisons):
        raise AssertionError(f"kernel outside tolerance for {problem}:\n  "
                             + "\n  ".join(str(c) for c in comparisons))
