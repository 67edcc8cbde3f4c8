# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: -all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 3. Forward: from blocked attention to the FlashAttention kernels
#
# **Claim.** Attention decomposes over tiles of S: blocked attention (full rows of S per query
# block) and FlashAttention (online softmax, one tile of S at a time) give standard attention's
# answer to float64 rounding. Every registered kernel pair's forward
# (`numba_flash.registry.PAIRS`) matches float64 truth within the tolerance rule (2× NumPy's
# same-precision error; half precision's for float16 and bfloat16 inputs, which the 16-bit
# pairs multiply as stored and the others widen to float32) across (N, d), in float32,
# bfloat16 and float16 wherever it runs itself, and the pairs whose tiles can be chosen give
# the same answer, to float64 rounding, whatever the tile size.
#
# On the CUDA simulator the sizes are small, and the `wgmma` pair (one 64×64 tile shape) runs a
# single tiny case a dtype: there its Hopper tensor-core products are NumPy models, several
# times slower than the other pairs. On a GPU it runs the whole sweep where it can
# (float32, d ≤ 128; on a GPU other than sm_90 it falls back to `fa2`).

# %%

import matplotlib.pyplot as plt
import numpy as np

import numba_flash
import reference as ref
from numba_flash import flash_attention_forward, registry
from numba_flash.testing import Case, check_forward

from numba_flash.notebook import show  # inline in Jupyter; saved to figures/ as a script

SIM = numba_flash.SIMULATOR
Ns = [7, 19, 33] if SIM else [64, 257, 1023, 2049]
ds = [4, 16] if SIM else [32, 64, 128, 256]
print("simulator" if SIM else "GPU", Ns, ds)
for name, pair in registry.PAIRS.items():
    print(f"{name:8} {pair.summary}")

# %%
q, k, v, _ = Case("demo", 1, 1, 1, 37, 29, 8, causal=True).inputs(np.float64)
std = ref.attention_forward(q, k, v, causal=True)[0]
blk = ref.blocked_attention(q, k, v, block_m=8, block_n=8, causal=True)[0]
fa1 = ref.flash_forward(q, k, v, block_m=8, block_n=8, causal=True)[0]
fa2 = ref.flash_forward(q, k, v, block_m=8, block_n=8, causal=True, outer="q")[0]
ref_errors = {n: float(np.abs(x - std).max()) for n, x in
              (("blocked", blk), ("flash (Algorithm 1)", fa1), ("flash (FA-2 order)", fa2))}
print(ref_errors)

# %% [markdown]
# Each pair's forward error (out) against float64 truth (B = 1, H = 2), as a fraction of what
# the tolerance rule allows, one panel a dtype. A case a pair does not run itself is left out
# (`registry.resolve` names another pair), as is, on the simulator, every `wgmma` case but one.

# %%
DTYPES = ("float32", "bfloat16", "float16")


def sweep(name, dtype):
    """The (d, N) cases pair `name` runs itself here (no fallback) in dtype."""
    runs = [(d, n) for d in ds for n in Ns
            if registry.resolve(name, d, np.dtype(dtype)).name == name]
    return runs[:1] if SIM and name == "wgmma" and runs else runs


ratios = {}
for dtype in DTYPES:
    for name in registry.PAIRS:
        for d, n in sweep(name, dtype):
            q, k, v, _ = Case("sweep", 1, 2, 2, n, n, d).inputs(np.dtype(dtype))
            out, lse = flash_attention_forward(q, k, v, kernel=name)
            c = check_forward(q, k, v, out, lse)[0]
            ratios[(dtype, name, d, n)] = c.max_err / c.allowed
fig, axes = plt.subplots(1, len(DTYPES), figsize=(12, 3.8), sharey=True)
for ax, dtype in zip(axes, DTYPES):
    for i, name in enumerate(registry.PAIRS):
        for d in sorted({d for (t, p, d, _) in ratios if (t, p) == (dtype, name)}):
            pts = sorted((n, r) for (t, p, dd, n), r in ratios.items() if (t, p, dd) == (dtype, name, d))
            ax.plot(*zip(*pts), marker="o", color=f"C{i}", ls="-" if d == ds[-1] else ":",
                    label=f"{name} d={d}")
    ax.axhline(1.0, color="k", lw=0.8), ax.set_xlabel("N"), ax.set_title(dtype, fontsize=10)
    ax.set_yscale("log"), ax.legend(fontsize=6, ncol=2)
axes[0].set_ylabel("error / allowed")
show(fig, "error-vs-allowed")
for dtype in DTYPES:      # the worst case of each pair
    worst = {}
    for (t, name, _, _), r in ratios.items():
        if t == dtype:
            worst[name] = max(worst.get(name, 0.0), round(r, 3))
    print(f"{dtype:9} worst error / allowed:", worst)

# %% [markdown]
# Tile-size invariance (float64, so differences are pure rounding), for every pair with tiles
# to choose (`wgmma` has one tile shape, `Pair.fixed_tiles`).

# %%
tiles = ((8, 16), (16, 16), (32, 32))
q, k, v, _ = Case("tiles", 1, 1, 1, Ns[-1], Ns[-1], ds[-1], causal=True).inputs(np.float64)
spread = {}
for name, pair in registry.PAIRS.items():
    if pair.fixed_tiles:
        continue
    outs = [flash_attention_forward(q, k, v, causal=True, kernel=name, block_m=bm, block_n=bn)[0]
            for bm, bn in registry.tile_choices(name, "forward", ds[-1], np.float64, tiles)]
    spread[name] = (len(outs), max(float(np.abs(o - outs[0]).max()) for o in outs))
print("tiles tried and largest difference between them:", spread)

# %% [markdown]
# **Check the claim.**

# %%
assert max(ref_errors.values()) < 1e-13
for dtype in DTYPES:    # every pair that runs dtype itself at d = 16 was checked in it
    assert {p for t, p, _, _ in ratios if t == dtype} == {
        name for name in registry.PAIRS
        if registry.resolve(name, 16, np.dtype(dtype)).name == name}, (dtype, ratios)
assert set(registry.PAIRS) == {p for _, p, _, _ in ratios}
# every pair takes half inputs itself (as stored, or widened to float32 on the device)
assert all({p for t, p, _, _ in ratios if t == dt} == set(registry.PAIRS)
           for dt in ("float16", "bfloat16"))
assert max(ratios.values()) <= 1.0, ratios
assert spread and all(n >= 2 and s < 1e-13 for n, s in spread.values()), spread
print("claim holds")
