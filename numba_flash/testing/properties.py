"""Properties every registered kernel must have, as plain functions of (kernel, Problem).

Each returns an Outcome (comparisons under the tolerance helper) or None when the property
does not apply to the problem (e.g. key permutation under causal masking). Tests wrap them in
@given; `numba-flash fuzz` runs them as a campaign and saves failing examples.
"""

from dataclasses import dataclass, field

import numpy as np

import reference as ref

from .. import registry
from ..api import flash_attention_backward, flash_attention_forward
from .strategies import logits_regime
from .tolerance import (GRADIENT_MULTIPLE, Comparison, allowed_backward, allowed_forward,
                        check_backward, check_forward, compare, expand_kv, reference_p_dp,
                        truth_dtype)


@dataclass
class Outcome:
    prop: str
    kernel: str
    problem: object
    comparisons: list = field(default_factory=list)

    @property
    def ok(self):
        return all(c.ok for c in self.comparisons)

    @property
    def worst(self):
        """Largest error / allowed over the comparisons (inf for NaN or pattern failures)."""
        r = 0.0
        for c in self.comparisons:
            if not np.isfinite(c.max_err):
                return float("inf")
            ratio = float(c.max_err) / float(c.allowed) if c.allowed > 0 else (
                0.0 if c.max_err == 0 else float("inf"))
            r = max(r, ratio)
        return r

    def report(self):
        return (f"{self.prop} [{self.kernel}] on {self.problem.describe()}:\n  "
                + "\n  ".join(str(c) for c in self.comparisons))


def _forward(kernel, p, q, k, v, tiles=True, **kw):
    blocks = dict(block_m=p.block_m, block_n=p.block_n) if tiles and p.block_m else {}
    return flash_attention_forward(q, k, v, causal=p.causal, kernel=kernel, **blocks, **kw)


def forward_agrees(kernel, p):
    """out and lse within tolerance of truth; no NaN, no inf but lse = -inf for masked rows."""
    q, k, v, _ = p.inputs()
    out, lse = _forward(kernel, p, q, k, v)
    return Outcome("forward agrees", kernel, p, check_forward(q, k, v, out, lse, causal=p.causal))


def backward_agrees(kernel, p):
    """dq, dk, dv within tolerance of truth (3x NumPy's same-precision error)."""
    q, k, v, dout = p.inputs()
    out, lse = flash_attention_forward(q, k, v, causal=p.causal, kernel=kernel)
    grads = flash_attention_backward(dout, q, k, v, out, lse, causal=p.causal, kernel=kernel,
                                     block_m=p.block_m, block_n=p.block_n)
    return Outcome("backward agrees", kernel, p, check_backward(dout, q, k, v, *grads, causal=p.causal))


def _agreement(name, got, base, allowed):
    """got against base, allowed a given error (NaN and -inf patterns must match)."""
    c = compare(name, got, base, base, 0.0, np.float64)
    return Comparison(name, c.max_err, c.mean_err, allowed, c.ok or c.max_err <= allowed, c.note)


def tile_invariance(kernel, p):
    """The drawn tile size gives the default tile size's answer, within rounding."""
    if p.block_m is None:
        return None
    q, k, v, _ = p.inputs()
    out, lse = _forward(kernel, p, q, k, v)
    base_out, base_lse = _forward(kernel, p, q, k, v, tiles=False)
    truth = check_forward(q, k, v, base_out, base_lse, causal=p.causal)
    return Outcome("tile invariance", kernel, p, truth + [
        _agreement("out(tiles) - out(default)", out, base_out, 2 * truth[0].allowed),
        _agreement("lse(tiles) - lse(default)", lse, base_lse, 2 * truth[1].allowed)])


def row_shift_invariance(kernel, p):
    """Adding c_i to every logit of query i changes out not at all and lse by c_i. Done by
    appending a coordinate: q' = [q, c_i / scale], k' = [k, 1], with the original scale."""
    q, k, v, _ = p.inputs()
    scale = 1.0 / np.sqrt(p.d)
    c = np.random.default_rng(p.seed).uniform(-50, 50, size=q.shape[:-1]).astype(q.dtype)
    q2 = np.concatenate([q, (c / q.dtype.type(scale))[..., None]], axis=-1)
    # the shift the kernel sees: c / scale rounded to q's dtype (8 bits in bfloat16), times scale
    c = q2[..., -1].astype(np.float64) * scale
    k2 = np.concatenate([k, np.ones(k.shape[:-1] + (1,), k.dtype)], axis=-1)
    v2 = np.concatenate([v, np.zeros(v.shape[:-1] + (1,), v.dtype)], axis=-1)
    if q2.shape[-1] > 256:
        return None
    out, lse = _forward(kernel, p, q, k, v, tiles=False)
    out2, lse2 = _forward(kernel, p, q2, k2, v2, tiles=False, scale=scale)
    truth = check_forward(q, k, v, out, lse, causal=p.causal)
    eps = float(np.finfo(registry.kernel_dtype(q.dtype)).eps)     # lse's dtype
    lse_allowed = 2 * truth[1].allowed + 64 * eps * float(np.abs(c).max())
    return Outcome("row-shift invariance", kernel, p, truth + [
        _agreement("out(shifted) - out", out2[..., :p.d], out, 2 * truth[0].allowed),
        _agreement("lse(shifted) - c - lse", lse2 - c, lse, lse_allowed)])


def _permutation(prop, kernel, p, permute_keys):
    """Permute the rows of k and v together (out, lse unchanged) or of q (out, lse permuted
    alike); not under causal masking, which ties rows to positions."""
    if p.causal:
        return None
    q, k, v, _ = p.inputs()
    perm = np.random.default_rng(p.seed).permutation(p.Nk if permute_keys else p.Nq)
    out, lse = _forward(kernel, p, q, k, v, tiles=False)
    if permute_keys:
        out2, lse2 = _forward(kernel, p, q, k[..., perm, :], v[..., perm, :], tiles=False)
        expect_out, expect_lse = out, lse
    else:
        out2, lse2 = _forward(kernel, p, q[..., perm, :], k, v, tiles=False)
        expect_out, expect_lse = out[..., perm, :], lse[..., perm]
    truth = check_forward(q, k, v, out, lse)
    return Outcome(prop, kernel, p, truth + [
        _agreement("out(permuted) - expected", out2, expect_out, 2 * truth[0].allowed),
        _agreement("lse(permuted) - expected", lse2, expect_lse, 2 * truth[1].allowed)])


def key_permutation_invariance(kernel, p):
    """Permuting the rows of k and v together leaves out and lse unchanged (not causal)."""
    return _permutation("key permutation invariance", kernel, p, permute_keys=True)


def query_permutation_equivariance(kernel, p):
    """Permuting the rows of q permutes out and lse the same way (not causal)."""
    return _permutation("query permutation equivariance", kernel, p, permute_keys=False)


def ds_rows_sum_to_zero(kernel, p):
    """Every row of dS = P (dP - D) sums to zero, because D_i = sum_j P_ij dP_ij. Seen from
    outside: with all keys equal, dQ = dS K scale = (sum_j dS_ij) k scale = 0 (a cancellation,
    which the tolerance helper's term-relative floor allows for)."""
    q, k, v, dout = p.inputs()
    k = np.broadcast_to(k[..., :1, :], k.shape).copy()
    out, lse = flash_attention_forward(q, k, v, causal=p.causal, kernel=kernel)
    dq, dk, dv = flash_attention_backward(dout, q, k, v, out, lse, causal=p.causal, kernel=kernel,
                                          block_m=p.block_m, block_n=p.block_n)
    return Outcome("dS rows sum to zero", kernel, p,
                   check_backward(dout, q, k, v, dq, dk, dv, causal=p.causal)[:1])


def d_is_rowsum_of_p_dp(kernel, p):
    """The preprocess kernel's D = rowsum(dO * O) equals sum_j P_ij dP_ij from the reference."""
    from numba import cuda

    from ..kernels import backward
    q, k, v, dout = p.inputs()
    out, _ = flash_attention_forward(q, k, v, causal=p.causal, kernel="auto")
    dtype = q.dtype
    if ref.precision.half_format(dtype):    # their values in float32 for the NumPy reference
        q, k, v, dout = (a.astype(np.float32) for a in (q, k, v, dout))
    bh = p.B * p.H
    dt = registry.kernel_dtype(dtype)               # half inputs: the kernels' float32
    d_D = cuda.device_array((bh, p.Nq), dtype=dt)
    d_dout = cuda.to_device(dout.astype(dt).reshape(bh, p.Nq, p.d))
    backward.run_preprocess(d_dout, cuda.to_device(out.astype(dt).reshape(bh, p.Nq, p.d)),
                            d_D, d_dout)        # the 4th array (dq) is not touched
    D = d_D.copy_to_host().reshape(q.shape[:-1])
    kk, vv = expand_kv(q, k, v)
    P, dP = reference_p_dp(q, kk, vv, dout, p.causal, dtype=truth_dtype(q.dtype))
    same = (dout * ref.attention_forward(q, kk, vv, causal=p.causal)[0]).sum(axis=-1)
    # D is computed from the forward's O, so O's own error (checked by "forward agrees")
    # reaches D as sum_c |dO_ic| |O_ic - truth_ic|: that much is allowed on top
    hi = truth_dtype(q.dtype)
    o_truth = ref.attention_forward(q.astype(hi), kk.astype(hi), vv.astype(hi), causal=p.causal)[0]
    o_err = np.abs(out.astype(hi) - o_truth)
    o_err = float((np.abs(dout) * o_err).sum(axis=-1).max()) if o_err.size else 0.0
    return Outcome("D = rowsum(P * dP)", kernel, p,
                   [compare("D", D, (P * dP).sum(axis=-1), same, GRADIENT_MULTIPLE, dtype,
                            extra=o_err)])


NON_FINITE = ("NaN in q", "NaN in k", "NaN in v", "inf in q", "inf in k", "inf in v")


def _non_finite_inputs(p, kinds=NON_FINITE):
    """(kind, clean q, k, v, dout, q, k and v with non-finite entries): ordinary N(0, 1) data
    of p's shapes, then one of `kinds` (by p's seed) in one row: NaN, or +-inf, in a few of
    its entries. Under causal masking only key rows every query sees (j <= Nk - Nq) get one
    (in k or v), so that a masked key never meets one."""
    rng = np.random.default_rng(p.seed)
    q, k, v, dout = logits_regime("ordinary", p.B, p.H, p.Hk, p.Nq, p.Nk, p.d,
                                  np.dtype(p.dtype), p.seed)
    visible = p.Nk - p.Nq + 1 if p.causal else p.Nk       # keys every query row sees
    kinds = [kd for kd in kinds if kd.endswith("q") or visible >= 1]
    kind = kinds[rng.integers(len(kinds))]
    bad = {"q": q.copy(), "k": k.copy(), "v": v.copy()}
    x = bad[kind[-1]]
    b, h = rng.integers(x.shape[0]), rng.integers(x.shape[1])
    row = rng.integers(x.shape[2] if kind.endswith("q") else visible)
    cols = rng.choice(p.d, size=rng.integers(1, min(p.d, 3) + 1), replace=False)
    x[b, h, row, cols] = (np.nan if kind.startswith("NaN")
                          else rng.choice([-np.inf, np.inf], size=len(cols)))
    return kind, q, k, v, dout, bad["q"], bad["k"], bad["v"]


def _pattern(name, got, truth, nan_allowed):
    """A Comparison: NaN wherever truth is NaN, and elsewhere the same -inf / +inf / finite
    pattern as truth, except that entries may be NaN where nan_allowed (a pair whose tensor
    cores make an infinite input's rows NaN: registry.Pair.exact_infinities)."""
    got, truth = np.asarray(got, np.float64), np.asarray(truth)
    same = np.where(np.isnan(truth), np.isnan(got),
                    (np.isneginf(got) == np.isneginf(truth))
                    & (np.isposinf(got) == np.isposinf(truth)) & ~np.isnan(got))
    if nan_allowed:
        same |= np.isnan(got) & ~np.isnan(truth)
    bad = int((~same).sum())
    return Comparison(f"{name}: non-finite pattern", float(bad), float(bad), 0.0, bad == 0,
                      f"{bad} entries differ from truth's NaN / inf pattern" if bad else "")


def _finite_part(name, got, truth, allowed):
    """Where both are finite: the largest error, against `allowed` (the clean problem's)."""
    got, truth = np.asarray(got, np.float64), np.asarray(truth, np.float64)
    both = np.isfinite(got) & np.isfinite(truth)
    err = np.abs(got[both] - truth[both]) if both.any() else np.zeros(1)
    return Comparison(f"{name}: finite entries", float(err.max()), float(err.mean()), allowed,
                      bool(err.max() <= allowed))


def _truth64(q, k, v, causal, dout=None):
    kk, vv = expand_kv(q, k, v)
    f = lambda a: np.asarray(a, np.float64)
    with np.errstate(all="ignore"):
        out, lse = ref.attention_forward(f(q), f(kk), f(vv), causal=causal)
        if dout is None:
            return out, lse
        dq, dk, dv = ref.attention_backward(f(dout), f(q), f(kk), f(vv), causal=causal)
    if kk.shape != k.shape:
        dk, dv = ref.sum_kv_groups(dk, k.shape[1]), ref.sum_kv_groups(dv, k.shape[1])
    return dq, dk, dv


def non_finite_forward(kernel, p):
    """A NaN or an inf in q, k or v: out and lse NaN exactly where float64 standard attention
    on the same inputs is NaN (a NaN or +inf logit, a NaN in a visible value row) and +-inf
    where it is (an inf in a visible value row), lse -inf only where a row sees no key (a -inf
    logit is a masked key), and the finite rows within the clean problem's allowance."""
    from .. import registry
    kind, q, k, v, _, bad_q, bad_k, bad_v = _non_finite_inputs(p)
    nan_ok = kind.startswith("inf") and not registry.resolve(kernel, p.d, p.dtype).exact_infinities
    # the clean problem's allowances (its agreement is "forward agrees"' to check)
    allowed = allowed_forward(q, k, v, causal=p.causal)
    with np.errstate(all="ignore"):
        out, lse = _forward(kernel, p, bad_q, bad_k, bad_v, tiles=False)
    t_out, t_lse = _truth64(bad_q, bad_k, bad_v, p.causal)
    return Outcome("non-finite inputs (forward)", kernel, p, [
        _pattern(f"out [{kind}]", out, t_out, nan_ok), _pattern(f"lse [{kind}]", lse, t_lse, nan_ok),
        _finite_part("out", out, t_out, 2 * allowed[0]),
        _finite_part("lse", lse, t_lse, 2 * allowed[1])])


def non_finite_backward(kernel, p):
    """As non_finite_forward for dq, dk, dv (not causal: there a kernel's blocks decide
    whether a masked key meets a NaN row's 0 * NaN): NaN wherever truth is NaN, finite
    wherever truth is finite (NaN also allowed for an inf on tensor-core pairs)."""
    from .. import registry
    if p.causal:
        return None
    kind, q, k, v, dout, bad_q, bad_k, bad_v = _non_finite_inputs(p)
    nan_ok = kind.startswith("inf") and not registry.resolve(kernel, p.d, p.dtype).exact_infinities
    allowed = allowed_backward(dout, q, k, v)   # the clean problem's ("backward agrees"')
    with np.errstate(all="ignore"):
        out, lse = flash_attention_forward(bad_q, bad_k, bad_v, kernel=kernel)
        grads = flash_attention_backward(dout, bad_q, bad_k, bad_v, out, lse, kernel=kernel,
                                         block_m=p.block_m, block_n=p.block_n)
    truth = _truth64(bad_q, bad_k, bad_v, False, dout)
    checks = []
    for name, g, t, a in zip(("dq", "dk", "dv"), grads, truth, allowed):
        checks += [_pattern(f"{name} [{kind}]", g, t, nan_ok), _finite_part(name, g, t, 2 * a)]
    return Outcome("non-finite inputs (backward)", kernel, p, checks)


# name -> (function, which half of a pair it checks, which half's tiles to draw (None: the
# defaults))
PROPERTIES = {
    "forward agrees": (forward_agrees, "forward", "forward"),
    "tile invariance": (tile_invariance, "forward", "forward"),
    "row-shift invariance": (row_shift_invariance, "forward", None),
    "key permutation invariance": (key_permutation_invariance, "forward", None),
    "query permutation equivariance": (query_permutation_equivariance, "forward", None),
    "backward agrees": (backward_agrees, "backward", "backward"),
    "dS rows sum to zero": (ds_rows_sum_to_zero, "backward", "backward"),
    "D = rowsum(P * dP)": (d_is_rowsum_of_p_dp, "backward", None),
    "non-finite inputs (forward)": (non_finite_forward, "forward", None),
    "non-finite inputs (backward)": (non_finite_backward, "backward", "backward"),
}

__all__ = ["Outcome", "PROPERTIES"] + [
    f.__name__ for f, _, _ in PROPERTIES.values()]
