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
# # 3. Forward: from blocked attention to the FlashAttention kernels
#
# **Claim.** Attention decomposes over tiles of S: blocked attention (full rows of S per query
# block) and FlashAttention (online softmax, one tile of S at a time) give standard attention's
# answer to float64 rounding. Every registered kernel pair's forward (`numba_flash.registry.PAIRS`:
# `rowwise`, `tiled`, `fa2`, `wgmma`) matches float64 truth within the tolerance rule (2× NumPy's
# same-precision error) across (N, d), and the pairs whose tiles can be chosen give the same
# answer, to float64 rounding, whatever the tile size.
#
# On the CUDA simulator the sizes are small, and the `wgmma` pair (float32 only, one 64×64 tile
# shape) runs a single tiny case: there its Hopper tensor-core products are NumPy models,
# several times slower than the other pairs. On a GPU it runs the whole sweep where it can
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
# Each pair's forward error against float64 truth (float32 inputs, B = 1, H = 2), as a fraction
# of what the tolerance rule allows. A case a pair cannot run is left out (`can_run`), as is,
# on the simulator, every `wgmma` case but one.

# %%
def sweep(name):
    """The (d, N) cases pair `name` runs itself here (no fallback)."""
    if SIM and name == "wgmma":
        return [(16, 19)]
    return [(d, n) for d in ds for n in Ns if registry.resolve(name, d, np.float32).name == name]


ratios = {}
for name in registry.PAIRS:
    for d, n in sweep(name):
        q, k, v, _ = Case("sweep", 1, 2, 2, n, n, d).inputs(np.float32)
        out, lse = flash_attention_forward(q, k, v, kernel=name)
        c = check_forward(q, k, v, out, lse)[0]
        ratios[(name, d, n)] = c.max_err / c.allowed
fig, ax = plt.subplots(figsize=(6, 3.5))
for name in registry.PAIRS:
    for d in sorted({d for (p, d, _) in ratios if p == name}):
        pts = sorted((n, r) for (p, dd, n), r in ratios.items() if (p, dd) == (name, d))
        ax.plot(*zip(*pts), marker="o", label=f"{name} d={d}")
ax.axhline(1.0, color="k", lw=0.8), ax.set_xlabel("N"), ax.set_ylabel("error / allowed")
ax.set_yscale("log"), ax.legend(fontsize=7, ncol=2)
show(fig, "error-vs-allowed")
print({key: round(r, 3) for key, r in ratios.items()})

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
here = registry.current_device()
assert {name for name, _, _ in ratios} == {name for name, pair in registry.PAIRS.items()
                                           if pair.can_run(16, np.float32, here)}, ratios
assert max(ratios.values()) <= 1.0, ratios
assert spread and all(n >= 2 and s < 1e-13 for n, s in spread.values()), spread
print("claim holds")
