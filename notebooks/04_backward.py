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
# # 4. Backward: D, recomputed P, and gradients
#
# **Claim.** The backward needs only q, k, v, out and lse: P is recomputed as exp(S − lse), and
# D_i = rowsum(dO∘O)_i equals Σ_j P_ij dP_ij, so dS = P∘(dP − D) never needs a full row of P at
# once. Every registered kernel pair (`numba_flash.registry.PAIRS`; the forward and the
# backward of one name, which forms S as its forward did) gives dq, dk, dv that match float64
# truth within the tolerance rule (3× NumPy's same-precision error, half precision's for half
# inputs) in every dtype it runs itself: float32 and float64 (`wgmma`: float32), float16 and
# bfloat16 (the 16-bit pairs multiply them as stored, the others widen them to float32); and
# in float64 the gradients match central finite differences.
#
# On the CUDA simulator the case is tiny (GQA, causal, Nq = 13, Nk = 17, d = 8), `wgmma`
# included: its Hopper tensor-core products are NumPy models there, the slowest pair to run.

# %%

import matplotlib.pyplot as plt
import numpy as np

import numba_flash
import reference as ref
from numba_flash import flash_attention_backward, flash_attention_forward, registry
from numba_flash.testing import Case, check_backward

from numba_flash.notebook import show  # inline in Jupyter; saved to figures/ as a script

SIM = numba_flash.SIMULATOR
case = Case("demo", 1, 2, 1, 13, 17, 8, causal=True) if SIM else Case("demo", 2, 8, 2, 513, 700, 64, causal=True)
q, k, v, dout = case.inputs(np.float64)

# %% [markdown]
# D two ways, in the reference: rowsum(dO∘O) and Σ_j P_ij dP_ij.

# %%
kk, vv = ref.repeat_kv(k, case.H), ref.repeat_kv(v, case.H)
out, lse = ref.attention_forward(q, kk, vv, causal=True)
S = np.where(ref.causal_mask(case.Nq, case.Nk), q @ np.swapaxes(kk, -1, -2) / np.sqrt(case.d), -np.inf)
P_recomputed = np.exp(S - lse[..., None])                # from lse alone, as the kernels do
dP = dout @ np.swapaxes(vv, -1, -2)
D_rowsum, D_pdp = (dout * out).sum(-1), (P_recomputed * dP).sum(-1)
print("P from lse vs softmax:", np.abs(P_recomputed - ref.safe_softmax(S)).max(),
      "| D two ways:", np.abs(D_rowsum - D_pdp).max())

# %% [markdown]
# Every pair against truth, in each dtype it runs itself (no fallback: `registry.resolve`
# names the pair), as a fraction of what the tolerance rule allows.

# %%
DTYPES = ("float16", "bfloat16", "float32", "float64")
runs_itself = {(name, dt) for name in registry.PAIRS for dt in DTYPES
               if registry.resolve(name, case.d, np.dtype(dt)).name == name}
results = {}
for name in registry.PAIRS:
    for dt in DTYPES:
        if (name, dt) not in runs_itself:
            continue
        qd, kd, vd, dod = case.inputs(np.dtype(dt))
        o, l = flash_attention_forward(qd, kd, vd, causal=True, kernel=name)
        grads = flash_attention_backward(dod, qd, kd, vd, o, l, causal=True, kernel=name)
        results[(name, dt)] = check_backward(dod, qd, kd, vd, *grads, causal=True)
        for c in results[(name, dt)]:
            print(f"{name:15} {dt:8}  {c}")
fig, ax = plt.subplots(figsize=(11, 3.8))
labels = [f"{name}\n{dt}" for name, dt in results]
for i, grad in enumerate(("dq", "dk", "dv")):
    ax.bar(np.arange(len(results)) + (i - 1) * 0.27, [cs[i].max_err / cs[i].allowed for cs in results.values()],
           width=0.27, label=grad)
ax.axhline(1.0, color="k", lw=0.8)
ax.set_xticks(range(len(results)), labels, fontsize=7, rotation=90)
ax.set_yscale("log"), ax.set_ylabel("error / allowed"), ax.legend(fontsize=8)
show(fig, "gradient-error")

# %% [markdown]
# Finite differences on a few entries (float64, the default kernel `"auto"`), loss = Σ out∘W.

# %%
small = Case("fd", 1, 2, 1, 5, 7, 3, causal=True)
qs, ks, vs, W = small.inputs(np.float64, seed=4)
o, l = flash_attention_forward(qs, ks, vs, causal=True)
gq, gk, gv = flash_attention_backward(W, qs, ks, vs, o, l, causal=True)
loss = lambda: float((flash_attention_forward(qs, ks, vs, causal=True)[0] * W).sum())
fd_err = 0.0
for x, g in ((qs, gq), (ks, gk), (vs, gv)):
    idx = (0, 0, 2, 1)
    x0 = x[idx]
    x[idx] = x0 + 1e-6
    up = loss()
    x[idx] = x0 - 1e-6
    down = loss()
    x[idx] = x0
    fd_err = max(fd_err, abs((up - down) / 2e-6 - g[idx]))
print("largest |finite difference - kernel gradient|:", fd_err)

# %% [markdown]
# **Check the claim.**

# %%
assert np.allclose(P_recomputed, ref.safe_softmax(S), atol=1e-14)
assert np.abs(D_rowsum - D_pdp).max() < 1e-12
assert set(registry.PAIRS) == {name for name, _ in results}
# every pair takes half inputs itself (as stored, or widened to float32 on the device)
assert all((name, dt) in results for name in registry.PAIRS for dt in ("float16", "bfloat16"))
assert all((name, "float32") in results for name in ("rowwise", "tiled", "fa2"))
assert all(c.ok for cs in results.values() for c in cs)
assert fd_err < 1e-7
print("claim holds")
