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
# # 2. Softmax three ways
#
# **Claim.** Naive softmax overflows once a logit passes log(float max) (≈ 88.7 in float32);
# safe softmax subtracts the row max first; online softmax gets the same answer in one pass,
# keeping a running max m and a running sum l rescaled by exp(m_old − m_new) whenever m grows.

# %%

import matplotlib.pyplot as plt
import numpy as np

import reference as ref

from numba_flash.notebook import show  # inline in Jupyter; saved to figures/ as a script

# %%
x = (np.random.default_rng(0).standard_normal((1, 64)) * 30 + np.linspace(0, 120, 64)).astype(np.float32)
naive, safe, online = ref.naive_softmax(x), ref.safe_softmax(x), ref.online_softmax(x, block_n=8)
print("naive has NaN:", np.isnan(naive).any(), "| safe sums to", safe.sum(), "| online - safe:",
      np.abs(online - safe).max())

# %% [markdown]
# The running statistics, element by element: m only grows; l drops each time m jumps
# (the old sum is rescaled by exp(m_old − m_new)) and then grows again.

# %%
ms, ls = [], []
for j in range(1, x.shape[1] + 1):
    m, l = ref.online_softmax_stats(x[:, :j])
    ms.append(float(m[0])), ls.append(float(l[0]))
fig, (a1, a2) = plt.subplots(2, 1, sharex=True, figsize=(6, 4))
a1.plot(ms, marker="."), a1.set_ylabel("running max m")
a2.plot(ls, marker="."), a2.set_ylabel("running sum l"), a2.set_xlabel("elements seen")
show(fig, "running-stats")

# %% [markdown]
# **Check the claim.**

# %%
assert np.isnan(naive).any() and np.isfinite(safe).all() and np.isfinite(online).all()
np.testing.assert_allclose(online, safe, rtol=1e-5, atol=1e-7)
assert all(b >= a for a, b in zip(ms, ms[1:]))                 # m never decreases
assert any(b < a for a, b in zip(ls, ls[1:]))                  # l was rescaled at least once
m, l = ref.online_softmax_stats_blocked(x, 8)
np.testing.assert_allclose(l, np.exp(x - x.max()).sum(), rtol=1e-5)
print("claim holds")
