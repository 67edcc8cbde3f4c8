# %% [markdown]
# # 6. Performance
#
# **Claim** (H200, float32, 2026-11-29 20:47 UTC, `numba-flash bench`, the fa2 forward and the
# fa2-atomic backward as the defaults, both with their 16-byte global accesses, the backward with
# its prefetch of the next Q and dO tiles): the `fa2` forward beats torch's math backend at every
# N ≥ 1024 in all four cases (d = 64 and 128, causal or not); the closest is d = 128 without
# masking, 1.02× at N = 1024, and at N = 512 it loses there. It is 1.06–1.94× the `tiled` forward
# it grew from. Forward+backward (fa2 + fa2-atomic) beats torch math under causal masking at
# d = 64 from N = 512 and at d = 128 from N = 2048 (0.99× at 1024 in this run, 1.06× at 17:55);
# without masking it is behind except at d = 64 from N = 8192 (1.06×, 1.01×): 0.83–0.98× at
# d = 64, 0.63–0.71× at d = 128 (N ≥ 1024). The fa2-atomic backward makes forward+backward
# 1.12–1.44× what it is with the fa2 backward, which is 1.16–1.56× the tiled one (N ≥ 1024).
# `fa2-tc`, fa2-atomic with its accumulating products on tensor cores (3xTF32), is within
# 0.95–1.07× of the default. torch's efficient kernel is ahead everywhere. The JSON in
# `notebooks/data` holds every figure with its date, GPU and versions.

# %%
import json
import pathlib

import matplotlib.pyplot as plt

base = pathlib.Path("notebooks/data") if pathlib.Path("notebooks/data").exists() else pathlib.Path("data")
data = json.loads((base / "bench-h200-2026-11-29-prefetch-tc.json").read_text())
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


def ratios(mode, d, causal, ours="numba-flash fa2", peer="torch math", from_n=1024):
    """ours / peer TFLOP/s at every N >= from_n both have."""
    a, b = dict(curve(ours, mode, d, causal)), dict(curve(peer, mode, d, causal))
    return {n: a[n] / b[n] for n in a if n >= from_n and n in b}


def beats(mode, d, causal, from_n=1024, **kw):
    return all(r > 1 for r in ratios(mode, d, causal, from_n=from_n, **kw).values())


assert all(beats("fwd", d, c) for d in (64, 128) for c in (False, True))
assert 1.0 < ratios("fwd", 128, False)[1024] < 1.05
assert ratios("fwd", 128, False, from_n=512)[512] < 1
gain = [r for d in (64, 128) for c in (False, True)
        for r in ratios("fwd", d, c, peer="numba-flash tiled", from_n=512).values()]
assert 1.0 < min(gain) and max(gain) < 2.0, gain
assert beats("fwd+bwd", 64, True, from_n=512) and beats("fwd+bwd", 128, True, from_n=2048)
assert 0.95 < ratios("fwd+bwd", 128, True, from_n=512)[1024] < 1
wins = {(d, n) for d in (64, 128) for n, r in ratios("fwd+bwd", d, False, from_n=512).items()
        if r > 1}
assert wins == {(64, 8192), (64, 16384)}, wins
atomic_gain = [r for d in (64, 128) for c in (False, True)
               for r in ratios("fwd+bwd", d, c, peer="numba-flash fa2, backward fa2").values()]
assert 1.1 < min(atomic_gain) and max(atomic_gain) < 1.45, atomic_gain
tc_ratio = [r for d in (64, 128) for c in (False, True)
            for r in ratios("fwd+bwd", d, c, ours="numba-flash fa2, backward fa2-tc",
                            peer="numba-flash fa2", from_n=512).values()]
assert 0.94 < min(tc_ratio) and max(tc_ratio) < 1.08, tc_ratio
bwd_gain = [r for d in (64, 128) for c in (False, True)
            for r in ratios("fwd+bwd", d, c, ours="numba-flash fa2, backward fa2",
                            peer="numba-flash fa2, backward tiled").values()]
assert 1.1 < min(bwd_gain) and max(bwd_gain) < 1.6, bwd_gain
for mode in ("fwd", "fwd+bwd"):
    for d in (64, 128):
        for c in (False, True):
            assert not any(r > 1 for r in ratios(mode, d, c, peer="torch efficient",
                                                 from_n=512).values())
print("claim holds")
