# %% [markdown]
# # 1. The memory wall
#
# **Claim.** Standard attention materializes S and P, N×N each: at N = 4096, d = 64, float32
# they take 64 MiB apiece per head against 1 MiB for Q. FlashAttention keeps only O(N) besides
# its inputs and outputs; measured on an H200, numba-flash's extra memory stays flat as N grows
# while the materializing peers grow as N².

# %%
import json
import pathlib

import matplotlib.pyplot as plt
import numpy as np

import reference as ref

# %% [markdown]
# Bytes per head, from `reference.attention_memory`.

# %%
Ns = 2 ** np.arange(8, 17)
mem = [ref.attention_memory(int(n), 64, np.float32) for n in Ns]
MiB = 2 ** 20
fig, ax = plt.subplots()
for key in ("Q", "S", "lse"):
    ax.loglog(Ns, [m[key] / MiB for m in mem], marker="o", label=key)
ax.set_xlabel("N"), ax.set_ylabel("MiB per head (float32, d = 64)"), ax.legend()
plt.show()
m4k = ref.attention_memory(4096, 64, np.float32)
print({k: f"{v / MiB:g} MiB" for k, v in m4k.items()})

# %% [markdown]
# Measured peak extra device memory, from the benchmark JSON kept in the repo
# (`numba-flash bench` on an H200).

# %%
data = json.loads((pathlib.Path("notebooks/data") / "bench-h200-2026-11-29.json").read_text()) \
    if pathlib.Path("notebooks/data").exists() else \
    json.loads((pathlib.Path("data") / "bench-h200-2026-11-29.json").read_text())
print(data["environment"])
rows = [r for r in data["records"] if r["d"] == 64 and not r["causal"] and "peak_bytes" in r
        and r["N"] <= 16384]
fig, ax = plt.subplots()
curves = {}
for (impl, mode) in sorted({(r["impl"], r["mode"]) for r in rows}):
    pts = sorted((r["N"], r["peak_bytes"] / 1e9) for r in rows if (r["impl"], r["mode"]) == (impl, mode))
    curves[(impl, mode)] = pts
    ax.loglog(*zip(*pts), marker="o", label=f"{impl} {mode}")
ax.set_xlabel("N (B·N = 16k, H = 32, d = 64)"), ax.set_ylabel("peak extra GB"), ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# **Check the claim.**

# %%
assert m4k["S"] == m4k["P"] == 64 * MiB and m4k["Q"] == 1 * MiB
flash = dict(curves[("numba-flash tiled", "fwd+bwd")])
math_ = dict(curves[("torch math", "fwd+bwd")])
assert max(flash.values()) <= 1.0, flash                     # flat, under 1 GB at every N
assert math_[16384] > 50 * flash[16384]                       # the N^2 peer needs far more
print("claim holds")
