# %% [markdown]
# # 6. Performance
#
# **Claim** (H200, float32, 2026-11-29, `numba-flash bench`): the tiled forward beats torch's
# math backend at every N ≥ 1024 at d = 64 (not causal and causal) and under causal masking at
# d = 128, but not at d = 128 without masking; forward+backward is behind torch math except
# under causal masking at d = 64 from N = 2048 on (a tie at 1024); torch's efficient kernel is ahead everywhere. The JSON in
# `notebooks/data` holds every figure with its date, GPU and versions.

# %%
import json
import pathlib

import matplotlib.pyplot as plt

base = pathlib.Path("notebooks/data") if pathlib.Path("notebooks/data").exists() else pathlib.Path("data")
data = json.loads((base / "bench-h200-2026-11-29.json").read_text())
env, records = data["environment"], data["records"]
print(env)


def curve(impl, mode, d, causal):
    return sorted((r["N"], r["tflops"]) for r in records if "tflops" in r and r["N"] <= 16384
                  and (r["impl"], r["mode"], r["d"], r["causal"]) == (impl, mode, d, causal))


# %%
fig, axes = plt.subplots(2, 4, figsize=(14, 6), sharex=True)
for row, mode in enumerate(("fwd", "fwd+bwd")):
    for col, (d, causal) in enumerate(((64, False), (64, True), (128, False), (128, True))):
        ax = axes[row, col]
        for impl in sorted({r["impl"] for r in records}):
            pts = curve(impl, mode, d, causal)
            if pts:
                ax.semilogx(*zip(*pts), marker="o", label=impl)
        ax.set_title(f"{mode} d={d}{' causal' if causal else ''}", fontsize=9)
        ax.set_ylabel("TFLOP/s")
axes[0, 0].legend(fontsize=7)
plt.show()

# %% [markdown]
# **Check the claim** against the recorded figures.

# %%
assert env["gpu"] == "NVIDIA H200" and env["date"].startswith("2026-11-29")


def beats(mode, d, causal, from_n=1024):
    ours, peer = dict(curve("numba-flash tiled", mode, d, causal)), dict(curve("torch math", mode, d, causal))
    return all(ours[n] > peer[n] for n in ours if n >= from_n and n in peer)


assert beats("fwd", 64, False) and beats("fwd", 64, True) and beats("fwd", 128, True)
assert not beats("fwd", 128, False) and not beats("fwd+bwd", 64, False)
assert not beats("fwd+bwd", 128, False) and not beats("fwd+bwd", 128, True)
assert beats("fwd+bwd", 64, True, from_n=2048) and not beats("fwd+bwd", 64, True)
eff = dict(curve("torch efficient", "fwd", 64, False))
assert all(eff[n] > t for n, t in curve("numba-flash tiled", "fwd", 64, False))
print("claim holds")
