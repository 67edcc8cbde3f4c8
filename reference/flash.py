"""FlashAttention forward and backward in NumPy, block by block, as in the papers.

No function here holds more than one (block_m x block_n) tile of S or P at a time (per
leading index). Names follow the papers: S, P, m (running row max), l (running row sum),
lse = m + log l, D = rowsum(dO * O), dS = P * (dP - D). Shapes as in reference.attention.
"""

import numpy as np

from .attention import causal_mask, check_qkv, default_scale
from .softmax import _check_block


def _safe(m):
    """m with -inf replaced by 0, so that x - m is -inf (not NaN) when x is -inf too."""
    return np.where(np.isneginf(m), 0, m)


def _score_block(q_i, k_j, rows, cols, nq, nk, causal, scale):
    """S_ij = scale Q_i K_j^T for query rows `rows` and key cols `cols`, masked with -inf."""
    S_ij = (q_i @ np.swapaxes(k_j, -1, -2)) * q_i.dtype.type(scale)
    if causal:
        visible = causal_mask(nq, nk)[rows][:, cols]
        S_ij = np.where(visible, S_ij, -np.inf).astype(q_i.dtype)
    return S_ij


def _blocks(n, block):
    return [slice(s, min(s + block, n)) for s in range(0, n, block)]


def flash_forward(q, k, v, *, block_m, block_n, causal=False, scale=None, outer="kv"):
    """FlashAttention forward. Returns (out, lse) like reference.attention_forward.

    outer="kv": Algorithm 1 of FlashAttention (Dao et al. 2022): the outer loop runs over K/V
      blocks, the inner over Q blocks; O_i is kept normalized and rescaled on every visit by
      l_i exp(m_i - m_new) / l_new.
    outer="q": the FlashAttention-2 order (Dao 2023), as the kernels do: the outer loop runs
      over Q blocks; O_i stays unnormalized (rescaled by exp(m_old - m_new)) and is divided by
      l once at the end.
    """
    q, k, v = check_qkv(q, k, v)
    _check_block("block_m", block_m)
    _check_block("block_n", block_n)
    scale = default_scale(q.shape[-1], scale)
    if outer not in ("kv", "q"):
        raise ValueError(f"outer must be 'kv' or 'q', got {outer!r}")
    nq, nk = q.shape[-2], k.shape[-2]
    lead = q.shape[:-2]
    dt = q.dtype
    out = np.zeros(lead + (nq, v.shape[-1]), dtype=dt)
    l = np.zeros(lead + (nq,), dtype=dt)
    m = np.full(lead + (nq,), -np.inf, dtype=dt)
    Q_blocks, K_blocks = _blocks(nq, block_m), _blocks(nk, block_n)
    pairs = ([(i, j) for j in K_blocks for i in Q_blocks] if outer == "kv"
             else [(i, j) for i in Q_blocks for j in K_blocks])
    for i, j in pairs:
        S_ij = _score_block(q[..., i, :], k[..., j, :], i, j, nq, nk, causal, scale)
        m_i, l_i = m[..., i], l[..., i]
        if outer == "kv":
            m_tilde = S_ij.max(axis=-1)                        # block row max
            P_tilde = np.exp(S_ij - _safe(m_tilde)[..., None])
            l_tilde = P_tilde.sum(axis=-1)
            m_new = np.maximum(m_i, m_tilde)
            alpha = np.exp(m_i - _safe(m_new))                 # rescales the old statistics
            beta = np.exp(m_tilde - _safe(m_new))              # rescales this block's
            l_new = alpha * l_i + beta * l_tilde
            num = (l_i * alpha)[..., None] * out[..., i, :] + beta[..., None] * (P_tilde @ v[..., j, :])
            out[..., i, :] = np.divide(num, l_new[..., None], out=np.zeros_like(num),
                                       where=l_new[..., None] > 0)
        else:
            m_new = np.maximum(m_i, S_ij.max(axis=-1))
            P_ij = np.exp(S_ij - _safe(m_new)[..., None])
            alpha = np.exp(m_i - _safe(m_new))
            l_new = alpha * l_i + P_ij.sum(axis=-1)
            out[..., i, :] = alpha[..., None] * out[..., i, :] + P_ij @ v[..., j, :]
        m[..., i], l[..., i] = m_new, l_new
    if outer == "q":
        out = np.divide(out, l[..., None], out=np.zeros_like(out), where=l[..., None] > 0)
    with np.errstate(divide="ignore"):
        lse = (_safe(m) + np.log(l)).astype(dt)                # -inf where l == 0
    return out, lse


def flash_backward(dout, q, k, v, out, lse, *, block_m, block_n, causal=False, scale=None):
    """FlashAttention backward from the saved out and lse only (no P kept).

    D = rowsum(dO * O) first; then the outer loop over K/V blocks and the inner over Q blocks
    recompute P_ij = exp(S_ij - lse_i) and accumulate dV_j += P_ij^T dO_i, dP_ij = dO_i V_j^T,
    dS_ij = P_ij * (dP_ij - D_i), dQ_i += dS_ij K_j scale, dK_j += dS_ij^T Q_i scale.
    Returns dq, dk, dv with q, k, v's shapes.
    """
    q, k, v = check_qkv(q, k, v)
    _check_block("block_m", block_m)
    _check_block("block_n", block_n)
    scale = default_scale(q.shape[-1], scale)
    dt = q.dtype
    s = dt.type(scale)
    dout, out, lse = (np.asarray(a, dtype=dt) for a in (dout, out, lse))
    nq, nk = q.shape[-2], k.shape[-2]
    D = (dout * out).sum(axis=-1)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for j in _blocks(nk, block_n):
        for i in _blocks(nq, block_m):
            S_ij = _score_block(q[..., i, :], k[..., j, :], i, j, nq, nk, causal, scale)
            P_ij = np.exp(S_ij - _safe(lse[..., i])[..., None])
            P_ij = np.where(np.isneginf(lse[..., i])[..., None], 0, P_ij)  # fully masked rows
            dv[..., j, :] += np.swapaxes(P_ij, -1, -2) @ dout[..., i, :]
            dP_ij = dout[..., i, :] @ np.swapaxes(v[..., j, :], -1, -2)
            dS_ij = P_ij * (dP_ij - D[..., i, None])
            dq[..., i, :] += (dS_ij @ k[..., j, :]) * s
            dk[..., j, :] += (np.swapaxes(dS_ij, -1, -2) @ q[..., i, :]) * s
    return dq, dk, dv
