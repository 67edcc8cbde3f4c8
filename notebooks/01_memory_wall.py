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
# # 1. The memory wall
#
# **Claim.** Standard attention materializes S and P, N×N each: at N = 4096, d = 64, float32
# they take 64 MiB apiece per head against 1 MiB for Q. FlashAttention keeps only O(N) besides
# its inputs and outputs. Measured on an H200 (the last bench, 2026-12-02 07:21 UTC, d = 64,
# B·N = 16k tokens, H = 32), forward+backward's peak extra memory is 0.54 GB at every N from 1k
# to 8k for both numba-flash pairs benched (`wgmma` and `fa2`), while torch's math backend,
# which materializes S and P, needs 9.1 GB at N = 1k and 69 GB at 8k: it doubles with each
# doubling of N (N² per head at B ∝ 1/N).

# %%
import json

import matplotlib.pyplot as plt
import numpy as np

import reference as ref

from numba_flash.notebook import data_file, show  # inline in Jupyter; saved to figures/ as a script

# %% [markdown]
# Bytes per head, from `reference.attention_memory`.

# %%
Ns = 2 ** np.arange(8, 17)
mem = [ref.attention_memory(int(n), 64, np.float32) for n in Ns]
MiB = 2 ** 20
fig, ax = plt.subplots(figsize=(6, 3.5))
for key in ("Q", "S", "lse"):
    ax.loglog(Ns, [m[key] / MiB for m in mem], marker="o", label=key)
ax.set_xlabel("N"), ax.set_ylabel("MiB per head (float32, d = 64)"), ax.legend()
show(fig, "bytes-per-head")
m4k = ref.attention_memory(4096, 64, np.float32)
print({k: f"{v / MiB:g} MiB" for k, v in m4k.items()})

# %% [markdown]
# Measured peak extra device memory, from the benchmark JSON kept in the repo
# (`numba-flash bench --mode both` on an H200; `notebooks/data/bench-h200-2026-12-02-final.json`).

# %%
data = json.loads(data_file("bench-h200-2026-12-02-final.json").read_text())
print(data["environment"])
rows = [r for r in data["records"] if r["d"] == 64 and not r["causal"] and "peak_bytes" in r]
fig, ax = plt.subplots(figsize=(8, 3.5))
curves = {}
impls = sorted({r["impl"] for r in rows})
for (impl, mode) in sorted({(r["impl"], r["mode"]) for r in rows}):
    pts = sorted((r["N"], r["peak_bytes"] / 1e9) for r in rows if (r["impl"], r["mode"]) == (impl, mode))
    curves[(impl, mode)] = dict(pts)
    ax.loglog(*zip(*pts), marker="o", color=f"C{impls.index(impl)}",
              linestyle="-" if mode == "fwd+bwd" else ":", label=f"{impl} ({mode})")
ax.set_xticks([1024, 2048, 4096, 8192], ["1k", "2k", "4k", "8k"]), ax.minorticks_off()
ax.set_xlabel("N (B·N = 16k, H = 32, d = 64)"), ax.set_ylabel("peak extra GB")
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
show(fig, "peak-memory")
for key in (("numba-flash wgmma, backward wgmma", "fwd+bwd"), ("numba-flash fa2", "fwd+bwd"),
            ("torch math", "fwd+bwd")):
    print(key, {n: round(gb, 2) for n, gb in curves[key].items()})

# %% [markdown]
# **Check the claim.**

# %%
assert m4k["S"] == m4k["P"] == 64 * MiB and m4k["Q"] == 1 * MiB
assert data["environment"]["gpu"] == "NVIDIA H200"
assert data["environment"]["date"].startswith("2026-12-02T07:21")
for impl in ("numba-flash wgmma, backward wgmma", "numba-flash fa2"):
    flash = curves[(impl, "fwd+bwd")]
    assert sorted(flash) == [1024, 2048, 4096, 8192], flash
    assert all(0.53 < gb < 0.55 for gb in flash.values()), flash      # flat: 0.54 GB at every N
math_ = curves[("torch math", "fwd+bwd")]
assert 9.0 < math_[1024] < 9.2 and 69 < math_[8192] < 70, math_
assert all(1.9 < math_[2 * n] / math_[n] < 2.1 for n in (1024, 2048, 4096)), math_  # doubles
print("claim holds")
