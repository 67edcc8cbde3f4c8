# %% [markdown]
# # 3. Forward: from blocked attention to the FlashAttention kernels
#
# **Claim.** Attention decomposes over tiles of S: blocked attention (full rows of S per query
# block) and FlashAttention (online softmax, one tile of S at a time) give standard attention's
# answer to float64 rounding; the Numba kernels match float64 truth within the tolerance rule
# (2× NumPy's same-precision error) across (N, d), whatever the tile size.

# %%
import matplotlib.pyplot as plt
import numpy as np

import numba_flash
import reference as ref
from numba_flash import flash_attention_forward
from numba_flash.testing import Case, check_forward

SIM = numba_flash.SIMULATOR
Ns = [7, 19, 33] if SIM else [64, 257, 1023, 2049]
ds = [4, 16] if SIM else [32, 64, 128, 256]
print("simulator" if SIM else "GPU", Ns, ds)

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
# Kernel error against float64 truth, as a fraction of what the tolerance rule allows.

# %%
ratios = {}
for kernel in sorted(numba_flash.kernels.FORWARD):
    for d in ds:
        for n in Ns:
            q, k, v, _ = Case("sweep", 1, 2, 2, n, n, d).inputs(np.float32)
            out, lse = flash_attention_forward(q, k, v, kernel=kernel)
            c = check_forward(q, k, v, out, lse)[0]
            ratios[(kernel, d, n)] = c.max_err / c.allowed
fig, ax = plt.subplots()
for kernel in sorted(numba_flash.kernels.FORWARD):
    for d in ds:
        ax.plot(Ns, [ratios[(kernel, d, n)] for n in Ns], marker="o", label=f"{kernel} d={d}")
ax.axhline(1.0, color="k", lw=0.8), ax.set_xlabel("N"), ax.set_ylabel("error / allowed")
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# Tile-size invariance of the tiled kernel (float64, so differences are pure rounding).

# %%
q, k, v, _ = Case("tiles", 1, 1, 1, Ns[-1], Ns[-1], ds[-1], causal=True).inputs(np.float64)
outs = {t: flash_attention_forward(q, k, v, causal=True, block_m=t[0], block_n=t[1])[0]
        for t in ((8, 16), (16, 16), (32, 32))}
base = outs[(16, 16)]
spread = max(float(np.abs(o - base).max()) for o in outs.values())
print("largest difference between tile sizes:", spread)

# %% [markdown]
# **Check the claim.**

# %%
assert max(ref_errors.values()) < 1e-13
assert max(ratios.values()) <= 1.0, ratios
assert spread < 1e-13
print("claim holds")
