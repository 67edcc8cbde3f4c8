"""Attention in half precision (float16, bfloat16), as NumPy models: what a kernel that takes
half inputs computes, and the standard-attention baseline its tolerance is measured against.

Half arrays are float32 arrays holding values of the format (precision.round_half); every
product is exact in float32 (two 11-bit or 8-bit significands) and is accumulated in float32,
as tensor cores do (the models add in float32 with NumPy's order; a kernel's order differs by a
few float32 roundings, far below a half unit).

- `attention_forward_half` / `attention_backward_half`: standard attention as a framework runs
  it in half precision (torch's math backend): each matrix product accumulated in float32 and
  its result stored in the half format: S, P, out; dP, dS, dq, dk, dv. The softmax is taken in
  float32 of the stored S. In float16, |S| > 65504 is inf there: the overflow FlashAttention
  avoids by never storing S.
- `flash_forward_half` / `flash_backward_half`: FlashAttention-2's rounding, the kernels'
  contract (issue 24): S, m, l, lse and every accumulator in float32; P rounded to the half
  format before P V (as FlashAttention does, so that P V runs on half tensor cores); out
  rounded once at the end; lse kept in float32. The backward recomputes P = exp(S - lse) in
  float32, rounds P for dV = P^T dO, forms dP = dO V^T and dS = P (dP - D) in float32 (with
  D = rowsum(dO * O) in float32 of the half dO and O), rounds dS to the half format for
  dQ = dS K and dK = dS^T Q, and stores dq, dk, dv rounded once.

Inputs are rounded to the format first (a float32 array of other values is taken as its
rounding). Shapes, masks and the scale as in reference.attention; the scale is applied to the
float32 product (a half-rounded scale would move every logit).
"""

import numpy as np

from .attention import _logsumexp, _scores, check_qkv, default_scale
from .precision import round_half
from .softmax import safe_softmax


def _inputs(fmt, *arrays):
    return [round_half(np.asarray(a, dtype=np.float32), fmt) for a in arrays]


def _mm(a, b):
    """a @ b of float32 arrays, accumulated in float32 (the tensor-core contract)."""
    return np.matmul(a, b, dtype=np.float32)


def attention_forward_half(q, k, v, fmt, *, causal=False, scale=None):
    """Standard attention with S, P and out stored in `fmt`. Returns (out, lse) as float32
    arrays (out holding `fmt` values; lse the float32 log-sum-exp of the stored S)."""
    q, k, v = check_qkv(*_inputs(fmt, q, k, v))
    scale = np.float32(default_scale(q.shape[-1], scale))
    with np.errstate(over="ignore", invalid="ignore"):
        S = round_half(_scores(q, k, causal, scale), fmt)
        P = round_half(safe_softmax(S), fmt)
        return round_half(_mm(P, v), fmt), _logsumexp(S).astype(np.float32)


def attention_backward_half(dout, q, k, v, fmt, *, causal=False, scale=None):
    """Gradients of standard attention with every matrix product's result stored in `fmt`
    (S, P, out, dP, dS, dq, dk, dv), D = rowsum(dO * O) in float32. Returns (dq, dk, dv)."""
    q, k, v = check_qkv(*_inputs(fmt, q, k, v))
    (dout,) = _inputs(fmt, dout)
    scale = np.float32(default_scale(q.shape[-1], scale))
    with np.errstate(over="ignore", invalid="ignore"):
        P = round_half(safe_softmax(round_half(_scores(q, k, causal, scale), fmt)), fmt)
        out = round_half(_mm(P, v), fmt)
        dv = round_half(_mm(np.swapaxes(P, -1, -2), dout), fmt)
        dP = round_half(_mm(dout, np.swapaxes(v, -1, -2)), fmt)
        D = np.sum(dout * out, axis=-1, keepdims=True, dtype=np.float32)
        dS = round_half(P * (dP - D), fmt)
        dq = round_half(_mm(dS, k) * scale, fmt)
        dk = round_half(_mm(np.swapaxes(dS, -1, -2), q) * scale, fmt)
    return dq, dk, dv


def _flash_p(S, lse):
    """P = exp(S - lse) in float32; 0 on rows that saw no key (lse = -inf)."""
    masked = np.isneginf(lse)[..., None]
    with np.errstate(invalid="ignore"):
        P = np.exp(S - np.where(masked, 0, lse[..., None]))
    return np.where(masked, np.float32(0), P).astype(np.float32)


def flash_forward_half(q, k, v, fmt, *, causal=False, scale=None):
    """The half kernels' forward (module docstring): S, m, l, lse in float32, P rounded to
    `fmt` before P V, out rounded once. Whole rows at once: the online softmax's rescaling
    gives the same P up to float32 roundings (reference.flash_forward checks the blocking).
    Returns (out in `fmt` values, lse in float32), float32 arrays."""
    q, k, v = check_qkv(*_inputs(fmt, q, k, v))
    scale = np.float32(default_scale(q.shape[-1], scale))
    S = _scores(q, k, causal, scale)                         # float32, never stored in fmt
    m = S.max(axis=-1)
    m_safe = np.where(np.isneginf(m), np.float32(0), m)
    with np.errstate(invalid="ignore"):
        P = np.exp(S - m_safe[..., None])                    # float32, <= 1
    l = P.sum(axis=-1, dtype=np.float32)
    acc = _mm(round_half(P, fmt), v)                         # P rounded for the half product
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(l[..., None] > 0, acc / np.where(l > 0, l, 1)[..., None], 0)
        lse = (m_safe + np.log(l)).astype(np.float32)        # -inf where l = 0
    return round_half(out.astype(np.float32), fmt), lse


def flash_backward_half(dout, q, k, v, out, lse, fmt, *, causal=False, scale=None):
    """The half kernels' backward from the forward's out (in `fmt`) and float32 lse (module
    docstring): P recomputed in float32 and rounded for dV, dS = P (dP - D) in float32 and
    rounded for dQ and dK, the gradients rounded once. Returns (dq, dk, dv) float32 arrays of
    `fmt` values."""
    q, k, v = check_qkv(*_inputs(fmt, q, k, v))
    dout, out = _inputs(fmt, dout, out)
    lse = np.asarray(lse, dtype=np.float32)
    scale = np.float32(default_scale(q.shape[-1], scale))
    P = _flash_p(_scores(q, k, causal, scale), lse)
    D = np.sum(dout * out, axis=-1, keepdims=True, dtype=np.float32)
    dv = _mm(np.swapaxes(round_half(P, fmt), -1, -2), dout)
    dP = _mm(dout, np.swapaxes(v, -1, -2))
    dS = round_half(P * (dP - D), fmt)
    dq = _mm(dS, k) * scale
    dk = _mm(np.swapaxes(dS, -1, -2), q) * scale
    return tuple(round_half(g.astype(np.float32), fmt) for g in (dq, dk, dv))
