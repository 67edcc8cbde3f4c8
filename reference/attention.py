"""Standard (materialized) attention, forward and backward, and blocked attention.

Shapes: q (..., Nq, d), k and v (..., Nk, d) with identical leading dims. Every function keeps
the dtype it is given. scale defaults to 1/sqrt(d). With causal=True, key j is masked for query
i when j > i + (Nk - Nq): bottom-right aligned, as FlashAttention >= 2.1 does. A query row
whose keys are all masked (possible when Nq > Nk) gives out = 0, lse = -inf, gradients 0.

attention_forward and attention_backward take xp=, the array namespace of their inputs: NumPy
by default, or one with NumPy's names for the few functions they use (swapaxes, where, exp,
log, amax, sum, arange) such as CuPy, to compute the same formulas on a GPU
(numba_flash.testing.truth picks one and adapts torch).
"""

import math

import numpy as np

from .softmax import _check_block, safe_softmax


def check_qkv(q, k, v, xp=np):
    """Validate and return q, k, v as arrays of one floating dtype with matching shapes
    (arrays of namespace xp other than NumPy are taken as they are; their dtypes are only
    compared with each other)."""
    if xp is np:
        q, k, v = (np.asarray(a) for a in (q, k, v))
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., N, d), got {tuple(a.shape)}")
        if xp is np and not np.issubdtype(a.dtype, np.floating):
            raise TypeError(f"{name} must be a floating array, got {a.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"leading dims differ: q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head dims differ: {q.shape[-1]} vs {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v lengths differ: {k.shape[-2]} vs {v.shape[-2]}")
    return q, k, v


def default_scale(d, scale=None):
    """1/sqrt(d) when scale is None; otherwise scale, which must be finite and positive."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be finite and positive, got {scale}")
    return scale


def causal_mask(nq, nk, *, xp=np):
    """Boolean (nq, nk) array, True where key j is visible to query i: j <= i + (nk - nq)."""
    i = xp.arange(nq)[:, None]
    j = xp.arange(nk)[None, :]
    return j <= i + (nk - nq)


def _scores(q, k, causal, scale, xp=np):
    """S = scale * q k^T with masked entries set to -inf (q's dtype: a Python float scalar
    is converted to it, NEP 50)."""
    S = (q @ xp.swapaxes(k, -1, -2)) * scale
    if causal:
        S = xp.where(causal_mask(q.shape[-2], k.shape[-2], xp=xp), S, -math.inf)
    return S


def _logsumexp(S, xp=np):
    """Row log-sum-exp of S, -inf for rows that are entirely -inf."""
    m = xp.amax(S, axis=-1)
    m_safe = xp.where(m == -math.inf, 0, m)
    l = xp.sum(xp.exp(S - m_safe[..., None]), axis=-1)
    with np.errstate(divide="ignore"):
        return m_safe + xp.log(l)  # log(0) = -inf for fully masked rows


def attention_forward(q, k, v, *, causal=False, scale=None, xp=np):
    """Standard attention: S = scale q k^T, P = softmax(S), out = P v.

    Materializes S and P (Nq x Nk per head). Returns out (..., Nq, d) and lse (..., Nq),
    lse = log sum_j exp(S_ij), -inf for fully masked rows, in q's dtype. xp: the inputs'
    array namespace (module docstring).
    """
    q, k, v = check_qkv(q, k, v, xp)
    scale = default_scale(q.shape[-1], scale)
    S = _scores(q, k, causal, scale, xp)
    P = safe_softmax(S, xp=xp)
    return P @ v, _logsumexp(S, xp)


def attention_backward(dout, q, k, v, *, causal=False, scale=None, xp=np):
    """Gradients of standard attention, with S and P materialized.

    dV = P^T dO, dP = dO V^T, D = rowsum(dO * O), dS = P * (dP - D),
    dQ = dS K * scale, dK = dS^T Q * scale. Returns dq, dk, dv with q, k, v's shapes, in q's
    dtype. xp: the inputs' array namespace (module docstring); dout must then have q's dtype.
    """
    q, k, v = check_qkv(q, k, v, xp)
    if xp is np:
        dout = np.asarray(dout, dtype=q.dtype)
    want = tuple(q.shape[:-1]) + (v.shape[-1],)
    if tuple(dout.shape) != want:
        raise ValueError(f"dout must have shape {want}, got {tuple(dout.shape)}")
    scale = default_scale(q.shape[-1], scale)
    P = safe_softmax(_scores(q, k, causal, scale, xp), xp=xp)
    out = P @ v
    dv = xp.swapaxes(P, -1, -2) @ dout
    dP = dout @ xp.swapaxes(v, -1, -2)
    D = xp.sum(dout * out, axis=-1, keepdims=True)
    dS = P * (dP - D)
    return (dS @ k) * scale, (xp.swapaxes(dS, -1, -2) @ q) * scale, dv


def blocked_attention(q, k, v, *, block_m, block_n, causal=False, scale=None):
    """Attention computed from blocks: for each block of block_m queries, the score blocks
    S_ij = scale Q_i K_j^T over key blocks of block_n are concatenated before one softmax.

    It shows that attention decomposes over tiles of S; the full row of S still exists per
    query block, which is what FlashAttention's online softmax removes. Returns (out, lse).
    """
    q, k, v = check_qkv(q, k, v)
    _check_block("block_m", block_m)
    _check_block("block_n", block_n)
    scale = default_scale(q.shape[-1], scale)
    nq, nk = q.shape[-2], k.shape[-2]
    mask = causal_mask(nq, nk) if causal else None
    out = np.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    lse = np.zeros(q.shape[:-1], dtype=q.dtype)
    for i0 in range(0, nq, block_m):
        Qi = q[..., i0:i0 + block_m, :]
        blocks = []
        for j0 in range(0, nk, block_n):
            S_ij = (Qi @ np.swapaxes(k[..., j0:j0 + block_n, :], -1, -2)) * q.dtype.type(scale)
            if mask is not None:
                S_ij = np.where(mask[i0:i0 + block_m, j0:j0 + block_n], S_ij, -np.inf).astype(q.dtype)
            blocks.append(S_ij)
        S_i = np.concatenate(blocks, axis=-1)
        out[..., i0:i0 + block_m, :] = safe_softmax(S_i) @ v
        lse[..., i0:i0 + block_m] = _logsumexp(S_i)
    return out, lse


def repeat_kv(x, heads):
    """Grouped-query attention helper: (B, Hk, N, d) -> (B, heads, N, d), each key head
    repeated for the heads // Hk query heads that share it."""
    x = np.asarray(x)
    if x.ndim != 4 or heads % x.shape[1]:
        raise ValueError(f"need (B, Hk, N, d) with Hk dividing {heads}, got {x.shape}")
    return np.repeat(x, heads // x.shape[1], axis=1)


def sum_kv_groups(dx, kv_heads):
    """Inverse of repeat_kv for gradients: (B, H, N, d) -> (B, kv_heads, N, d), summing the
    query heads that share each key head."""
    dx = np.asarray(dx)
    b, h, n, d = dx.shape
    return dx.reshape(b, kv_heads, h // kv_heads, n, d).sum(axis=2)
