# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: -all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 7. Float32 accuracy from TF32 tensor cores
#
# **Claim.** TF32 keeps 10 of float32's 23 mantissa bits, so a product of TF32-rounded inputs is
# off by about 2^-11 relative: thousands of float32 units of roundoff (u = 2^-24). Splitting each
# float32 into two TF32 numbers, x = big + small (to 2^-22 relative), and forming
# big·big + big·small + small·big ("3xTF32", three tensor-core products) recovers float32
# accuracy: summed in steps of 8 (one `mma.m16n8k8`), each step from zero and added in float32,
# as `numba_flash/kernels/fa2_mma.py` does, the error stays within a few u of Σ|a b|, like NumPy's
# float32 matmul, at every contraction length. These are NumPy models (`reference/precision.py`);
# on an H200, where the tensor core truncates while it adds, the kernel's sums measured 0.9–4.3 u
# (`tests/mma_probe.py`; [docs/performance.md](../docs/performance.md)).
#
# **Claim 2 (why kernels come in pairs).** The `fa2` pair forms the logits S = Q K^T one FMA
# per term in head-dim order, in its forward and again in its backward; the `wgmma` pair forms
# them in 3xTF32 steps on the tensor cores, in both. The FMA order's error reaches 9–13 u of
# Σ|q k| where the terms do not cancel (all positive, one dominant term; d = 64 and 128), while
# the 3xTF32 steps stay within ~5 u: S on tensor cores is no less accurate, in every regime
# here. But it is a different S: |S_3xTF32 − S_FMA| reaches ~14 u of Σ|q k|, over three times
# the 4 u (twice the forward's logit allowance, `numba_flash/testing/tolerance.py`) that the
# tolerance rule lets P move by. The backward recomputes P = exp(S − lse) from the forward's
# lse, so only a forward and a backward that form S the same way keep P exact: that is why
# `numba_flash.registry` registers a forward with its backward as one pair, and why the same
# `kernel=` name goes to both calls.
#
# **Claim 3 (16-bit operands, staged once, read either way).** The `wgmma16` kernels stage every
# bfloat16 / float16 tile (tokens × head dim, as stored) once, K-major, in core matrices of
# 8 rows × 16 bytes (`numba_flash/kernels/sm90/wgmma16.py`, `core_offset16`). A product that
# needs a tile the other way round (V in P·V; Q, dO and K in the backward's dK, dV, dQ) reads it
# through a transposed (MN-major) descriptor: element (c, k) of B at `core_offset16(k, c, W)`.
# The addresses that read visits are a permutation of the tile, B is exactly the stored tile
# transposed, and a product through it equals A·tile exactly on integers (the layout model here;
# on the H200 the tensor core's, `tests/test_wgmma16.py`).

# %%

import matplotlib.pyplot as plt
import numpy as np

import reference as ref

from numba_flash.notebook import show  # inline in Jupyter; saved to figures/ as a script

U = 2.0 ** -24
rng = np.random.default_rng(0)


def errors(a, b):
    """Max error of each way to form a @ b, in units of roundoff of sum |a b|."""
    truth = a.astype(np.float64) @ b
    units = (np.abs(a.astype(np.float64)) @ np.abs(b)) * U
    ways = {"TF32 (inputs rounded once)": ref.round_tf32(a).astype(np.float64) @ ref.round_tf32(b),
            "3xTF32, steps of 8": ref.matmul_3xtf32(a, b),
            "NumPy float32": a @ b}
    return {name: float((np.abs(c - truth) / units).max()) for name, c in ways.items()}


def draw(regime, k):
    a, b = rng.standard_normal((16, k)), rng.standard_normal((k, 8))
    if regime == "all positive":
        a, b = np.abs(a), np.abs(b)
    elif regime == "one dominant term":
        a, b = a * 0.1, b * 0.1
        a[:, 3], b[3, :] = 1e3, 1.0
    elif regime == "offset":
        a = a + 30
    return a.astype(np.float32), b.astype(np.float32)


lengths = (8, 16, 32, 64, 128, 256)
regimes = ("normal", "all positive", "one dominant term", "offset")
worst = {(r, k): errors(*draw(r, k)) for r in regimes for k in lengths}
for r in regimes:
    print(r, {k: {n: round(e, 1) for n, e in worst[r, k].items()} for k in (64, 256)})

# %%
fig, axes = plt.subplots(1, len(regimes), figsize=(14, 3.5), sharey=True)
for ax, r in zip(axes, regimes):
    for name in worst[r, lengths[0]]:
        ax.loglog(lengths, [max(worst[r, k][name], 1e-2) for k in lengths], marker="o", label=name)
    ax.set_title(r, fontsize=9)
    ax.set_xlabel("contraction length K")
axes[0].set_ylabel("max error / (u Σ|ab|)")
axes[0].legend(fontsize=7)
show(fig, "error-vs-length")

# %% [markdown]
# The logits, S = Q K^T for 64 queries and 64 keys, in the kernels' FMA order and as 3xTF32
# steps, against float64 truth (max over 5 draws, units of u Σ|q k|), and how far the two apart.

# %%
def logit_errors(regime, d):
    q, k = rng.standard_normal((64, d)), rng.standard_normal((64, d))
    if regime == "offset":
        q = q + 30
    elif regime == "all positive":
        q, k = np.abs(q), np.abs(k)
    elif regime == "one dominant term":
        q, k = q * 0.1, k * 0.1
        q[:, 3], k[:, 3] = 1e3, 1.0
    q, k = q.astype(np.float32), k.astype(np.float32)
    truth = q.astype(np.float64) @ k.T
    units = (np.abs(q.astype(np.float64)) @ np.abs(k.T)) * U
    s_fma, s_tc = ref.matmul_fma_order(q, k.T), ref.matmul_3xtf32(q, k.T)
    return np.array([(np.abs(s_fma - truth) / units).max(), (np.abs(s_tc - truth) / units).max(),
                     (np.abs(s_tc.astype(np.float64) - s_fma) / units).max()])


logits = {(r, d): np.max([logit_errors(r, d) for _ in range(5)], axis=0)
          for r in regimes for d in (64, 128)}
for key, (e_fma, e_tc, apart) in logits.items():
    print(key, f"FMA order {e_fma:.1f}, 3xTF32 {e_tc:.1f}, apart {apart:.1f}")

# %% [markdown]
# Where the elements of a 64 × 64 16-bit tile sit in shared memory, top-left 16 × 16 corner:
# colour = core matrix (offset // 64: 8 × 8 elements, 128 bytes), number = position in it.
# Left, the tile as staged (rows are tokens, columns the head dim: a core matrix's rows are 16
# contiguous bytes of one token). Right, the transposed operand B (c, k) the same memory gives
# under the MN-major descriptor: each core matrix read with the head dim as rows.

# %%
from numba_flash.kernels.sm90.wgmma16 import core_offset16_host  # noqa: E402

W = K16 = 64                                     # tile: K16 rows (the contraction) x W columns
rows, cols = np.meshgrid(np.arange(K16), np.arange(W), indexing="ij")
staged_at = core_offset16_host(rows, cols, W)    # where tile[r, c] is staged
cc, kk = np.meshgrid(np.arange(W), np.arange(K16), indexing="ij")
read_at = core_offset16_host(kk, cc, W)          # where B[c, k] is read (descriptor, b_rows=W)
tile16 = rng.integers(-8, 9, (K16, W))
smem = np.empty(K16 * W, np.int64)
smem[staged_at] = tile16
B16 = smem[read_at]
A16 = rng.integers(-8, 9, (64, K16))
fig, axes = plt.subplots(1, 2, figsize=(11, 5.2))
for ax, offsets, title, labels in (
        (axes[0], staged_at, "staged: tile[r, c]", ("c (head dim)", "r (tokens)")),
        (axes[1], read_at, "read transposed: B[c, k]", ("k (tokens)", "c (head dim)"))):
    corner = offsets[:16, :16]
    ax.imshow(corner // 64, cmap="tab20", vmin=0, vmax=19)
    for (i, j), off in np.ndenumerate(corner):
        ax.text(j, i, off % 64, ha="center", va="center", fontsize=5.5)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
show(fig, "layout16")

# %% [markdown]
# **Check the claims.**

# %%
x = (rng.standard_normal(4096) * 10.0 ** rng.integers(-20, 20, 4096)).astype(np.float32)
big, small = ref.split_tf32(x)
assert np.all(np.abs(big.astype(np.float64) + small - x) <= np.abs(x.astype(np.float64)) * 2.0 ** -22)
for (r, k), e in worst.items():
    if r != "one dominant term":        # there the dominant term's inputs are exact in TF32
        assert e["TF32 (inputs rounded once)"] > 100, (r, k, e)
    assert e["3xTF32, steps of 8"] < 5, (r, k, e)
    assert e["3xTF32, steps of 8"] < 3 * max(e["NumPy float32"], 1), (r, k, e)
for (r, d), (e_fma, e_tc, apart) in logits.items():
    assert e_tc <= max(e_fma, 1) and e_tc < 6, (r, d, e_fma, e_tc)
assert max(e[0] for e in logits.values()) > 8          # the FMA order's worst, ~10 u
assert max(e[2] for e in logits.values()) > 3 * 2 * 2  # apart by over 3x P's allowance
# claim 3: the transposed read is a permutation of the tile, B is the tile transposed, and a
# product through it is exact
assert sorted(read_at.ravel()) == list(range(K16 * W)) == sorted(staged_at.ravel())
assert (B16 == tile16.T).all()
assert (A16 @ B16.T == A16 @ tile16).all()
assert (staged_at[:8, :8] == np.arange(64).reshape(8, 8)).all()     # one core matrix, rows of 16 B
print("claim holds")
