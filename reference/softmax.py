"""Softmax three ways: naive, safe (max-subtracted) and online (one pass, running m and l).

All functions act on the last axis and keep the dtype they are given, so float32 input
measures float32 behaviour (naive softmax overflows at logits above ~88.7 in float32).
"""

import math

import numpy as np


def naive_softmax(x):
    """exp(x) / sum(exp(x)) over the last axis. Overflows (inf/inf = NaN) for large x."""
    x = np.asarray(x)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)
        return e / e.sum(axis=-1, keepdims=True)


def safe_softmax(x, *, xp=np):
    """Softmax with the row max m subtracted first: exp(x - m) <= 1, so nothing overflows.

    A row that is entirely -inf (fully masked) gives zeros, not NaN; a row holding a NaN or
    +inf gives NaN, as IEEE arithmetic does (exp(inf - inf) is NaN). xp: the array namespace
    x belongs to (NumPy; or CuPy, or numba_flash.testing.truth's torch adapter, to compute the
    same on a GPU).
    """
    if xp is np:
        x = np.asarray(x)
    m = xp.amax(x, axis=-1, keepdims=True)
    m_safe = xp.where(m == -math.inf, 0, m)  # guard: -inf - (-inf) would be NaN
    e = xp.exp(x - m_safe)
    l = xp.sum(e, axis=-1, keepdims=True)
    # e / l, and 0 where l = 0 (fully masked rows); NaN l (a NaN or +inf in the row) stays NaN
    return xp.where(l == 0, 0, e / xp.where(l == 0, 1, l))


def online_softmax_stats(x):
    """One pass over the last axis, element by element: returns (m, l) per row.

    m is the running max and l the running sum of exp(x_j - m); when a new element raises
    the max from m_old to m_new, the sum so far is rescaled by exp(m_old - m_new)
    (Milakov & Gimelshein 2018). Shapes: x (..., N) -> m, l (...,).
    """
    x = np.asarray(x)
    m = np.full(x.shape[:-1], -np.inf, dtype=x.dtype)
    l = np.zeros(x.shape[:-1], dtype=x.dtype)
    for j in range(x.shape[-1]):
        xj = x[..., j]
        m_new = np.maximum(m, xj)
        m_safe = np.where(np.isneginf(m_new), 0, m_new)
        l = l * np.exp(m - m_safe) + np.exp(xj - m_safe)
        m = m_new
    return m, l


def online_softmax_stats_blocked(x, block_n):
    """Block-wise form of online_softmax_stats: blocks of block_n columns at a time,
    as the FlashAttention kernels do. Shapes: x (..., N) -> m, l (...,)."""
    x = np.asarray(x)
    _check_block("block_n", block_n)
    m = np.full(x.shape[:-1], -np.inf, dtype=x.dtype)
    l = np.zeros(x.shape[:-1], dtype=x.dtype)
    for j0 in range(0, x.shape[-1], block_n):
        xb = x[..., j0:j0 + block_n]
        m_new = np.maximum(m, xb.max(axis=-1))
        m_safe = np.where(np.isneginf(m_new), 0, m_new)
        l = l * np.exp(m - m_safe) + np.exp(xb - m_safe[..., None]).sum(axis=-1)
        m = m_new
    return m, l


def online_softmax(x, block_n=None):
    """Softmax from the online statistics: exp(x - m) / l, with a second pass for the output.

    block_n=None walks element by element; an int walks in blocks of that many columns.
    """
    x = np.asarray(x)
    m, l = online_softmax_stats(x) if block_n is None else online_softmax_stats_blocked(x, block_n)
    m_safe = np.where(np.isneginf(m), 0, m)[..., None]
    e = np.exp(x - m_safe)
    l = l[..., None]
    return np.divide(e, l, out=np.zeros_like(e), where=l > 0)


def _check_block(name, value):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
