"""What attention costs: bytes held, HBM traffic (the papers' model) and FLOPs.

All counts are per (batch, head) unless a function says otherwise; multiply by B*H.
"""

import numpy as np


def attention_memory(nq, d, dtype=np.float32, nk=None):
    """Bytes of each array in standard attention and in FlashAttention, for one head.

    Returns a dict: Q, K, V, O (N x d), S, P (Nq x Nk, standard only), m, l, lse (Nq,
    FlashAttention only; the kernels save lse alone). For Nq = Nk = 4096, d = 64, float32:
    Q = 1 MiB, S = P = 64 MiB each.
    """
    nk = nq if nk is None else nk
    item = np.dtype(dtype).itemsize
    return {
        "Q": nq * d * item, "K": nk * d * item, "V": nk * d * item, "O": nq * d * item,
        "S": nq * nk * item, "P": nq * nk * item,
        "m": nq * item, "l": nq * item, "lse": nq * item,
    }


def hbm_accesses_standard(n, d):
    """HBM elements read + written by standard attention (FlashAttention Theorem 2):
    Theta(N d + N^2). Counted as: read Q, K (2Nd), write S (N^2), read S write P (2N^2),
    read P, V (N^2 + Nd), write O (Nd)."""
    return 4 * n * d + 4 * n * n


def hbm_accesses_flash(n, d, sram_elements):
    """HBM elements accessed by FlashAttention for on-chip memory of M = sram_elements:
    Theta(N^2 d^2 / M). K and V are read once each; Q and O are streamed once per K/V block of
    size B_c = M / (4d), i.e. N / B_c = 4 N d / M times, each pass moving 2 N d elements."""
    block_c = max(1, sram_elements // (4 * d))
    passes = -(-n // block_c)
    return 2 * n * d + passes * 2 * n * d


def hbm_crossover(d, sram_elements, n_max=1 << 20):
    """Smallest N (a power of two up to n_max) at which FlashAttention's modelled HBM traffic
    exceeds standard attention's, or None if it never does up to n_max.

    For large N the ratio flash / standard tends to 2 d^2 / M: with on-chip memory M larger
    than 2 d^2 (every real GPU at d <= 256) FlashAttention moves fewer bytes at every N; with
    a tiny M it stops paying once N spans several K/V blocks.
    """
    n = 1
    while n <= n_max:
        if hbm_accesses_flash(n, d, sram_elements) > hbm_accesses_standard(n, d):
            return n
        n *= 2
    return None


def visible_pairs(nq, nk, causal=False):
    """Number of (query, key) pairs not masked: nq*nk, or under bottom-right causal masking
    sum_i clip(i + nk - nq + 1, 0, nk)."""
    if not causal:
        return nq * nk
    i = np.arange(nq)
    return int(np.clip(i + (nk - nq) + 1, 0, nk).sum())


def forward_flops(nq, nk, d, causal=False, batch_heads=1):
    """FLOPs of the attention forward: 2 matmuls of 2*d FLOPs per visible (query, key) pair,
    4 * pairs * d (softmax not counted, as the papers do not)."""
    return 4 * visible_pairs(nq, nk, causal) * d * batch_heads


def backward_flops(nq, nk, d, causal=False, batch_heads=1):
    """FLOPs of the backward, counted as 2.5x forward (5 matmuls against 2: dV, dP, dQ, dK and
    the recomputation of S), the convention of FlashAttention-2 and Triton's tutorial."""
    return 2.5 * forward_flops(nq, nk, d, causal, batch_heads)


def recompute_flop_ratio():
    """FLOPs of FlashAttention training (forward + backward) over standard attention's.

    Standard: forward 2 matmuls, backward 4 (dV, dP, dQ, dK) -> 6. FlashAttention recomputes
    S in the backward: 2 + 5 = 7, a ratio of 7/6 = 1.17. The figure of about 1.33 often
    quoted is that of recomputing the whole forward (gradient checkpointing: (2 + 2 + 4) / 6);
    FlashAttention pays less because it recomputes only S and P, never O.
    Returns a dict with both ratios.
    """
    return {"flash": 7 / 6, "full_forward_recompute": 8 / 6}
