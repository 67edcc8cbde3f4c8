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
# # 5. Fuzzing for overflow, and a broken kernel caught
#
# **Claim.** The property tests' Hypothesis strategies draw shapes, GQA, causal masking, tiles,
# the four dtypes (float16, bfloat16, float32, float64) and logit regimes, from ordinary
# logits to |S| ~ 1e4 in float32 and ~ 1e5 in half precision, past float16's largest finite
# value (65504). A short campaign of them finds no failure, forward or backward, in any
# registered kernel pair (`numba_flash.registry.PAIRS`); the same campaign catches a forward
# that forgets to rescale l when the running max grows, and saves a reproducer that
# `numba-flash replay` re-runs (it fails again). With float16 inputs whose logits pass 65504,
# the `wgmma16` forward, which keeps S in float32, stays within the tolerance, while the same
# kernel holding S in float16 (a careless half kernel) returns NaN rows from that point on.
#
# On the CUDA simulator the campaign over the pairs is short indeed: 2 examples per (property,
# pair), Hypothesis's first and smallest, derandomized (the test suite's `ci` profile runs 3 per
# property and pair, `tests/test_properties.py`). The mutant gets 40, enough to reach the
# large-logit regimes that expose it.

# %%
import tempfile
from collections import Counter

import matplotlib.pyplot as plt
import numpy as np

import numba_flash
from numba_flash import cli, flash_attention_forward, registry
from numba_flash.notebook import show  # inline in Jupyter; saved to figures/ as a script
from numba_flash.testing import campaign, check_forward, mutants, profiles

# ci (derandomized) on the simulator, so this notebook gives the same answer every run
name, size = profiles.load("ci" if numba_flash.SIMULATOR else "gpu", numba_flash.SIMULATOR)
# real sizes are compile-bound (a few seconds per new tile / head dim / dtype): 5 examples per
# (property, kernel) there keep the notebook to minutes
examples = 2 if numba_flash.SIMULATOR else 5
outcomes, failures, _ = campaign.fuzz(size, examples=examples, progress=False,
                                      directory=tempfile.mkdtemp(),
                                      properties=["forward agrees", "backward agrees"])
worst = sorted(outcomes, key=lambda o: -o.worst)[:5]
print(len(outcomes), "examples,", len(failures), "failures; regimes drawn:",
      dict(Counter(o.problem.regime for o in outcomes)), "dtypes drawn:",
      dict(Counter(o.problem.dtype for o in outcomes)))
print("the worst (error / allowed):")
for o in worst:
    print(f"{o.worst:.3f}  {o.prop} [{o.kernel}] {o.problem.describe()}")

# %% [markdown]
# Now a mutant: `l *= alpha` removed from the `rowwise` pair's forward (one thread per query
# row), registered as a pair of its own for the campaign. Hypothesis starts from
# small problems (one K/V tile, where m never grows), so the campaign gets 40 examples on the
# mutant alone (tests/test_mutants.py shows 40 are enough for every mutant; 20 at real sizes,
# where there are many K/V tiles).

# %%
repro_dir = tempfile.mkdtemp()
with mutants.registered("l not rescaled when m grows") as broken:
    m_out, m_fail, paths = campaign.fuzz(size, examples=40 if numba_flash.SIMULATOR else 20,
                                         progress=False, directory=repro_dir,
                                         properties=["forward agrees"], kernels=[broken])
    print(f"{len(m_fail)} failing examples of {len(m_out)}; regimes drawn:",
          dict(Counter(o.problem.regime for o in m_out)))
    print("first failure:", m_fail[0].report() if m_fail else None)
    replay_rc = cli.main(["replay", paths[0]]) if paths else None

# %% [markdown]
# ## Half precision: where a careless kernel overflows
#
# float16 ends at 65504, and S = q kᵀ gets there long before softmax is in any danger (the
# online softmax subtracts the row max first). A kernel that holds S in float16 overflows to
# inf there, and inf − inf is NaN. The `wgmma16` pair multiplies float16 and bfloat16 as stored
# on the tensor core but keeps S, the softmax and O in float32, as FlashAttention does. Below,
# the same float16 inputs with q and k scaled up until the largest logit passes 65504, through
# `wgmma16` and through its mutant "S held in float16" (one line of the simulator's model of
# the wgmma product rounds each entry of S to float16: only the simulator can run it), each
# against float64 truth of the same inputs by the tolerance rule (error / allowed, worst of
# out and lse: at most 1 passes).

# %%
rng = np.random.default_rng(0)
q0, k0, v0 = (rng.standard_normal((1, 2, 40, 16)) for _ in range(3))
scales = np.geomspace(1, 400, 13)


def sweep(kernel):
    """Per scale c (q and k times c, float16): the largest logit max(q k^T), the worst error /
    allowed of out and lse (NaN where out has NaN rows), and the number of NaN rows."""
    rows = []
    for c in scales:
        q, k, v = (x.astype(np.float16) for x in (q0 * c, k0 * c, v0))
        out, lse = flash_attention_forward(q, k, v, kernel=kernel)
        logit = (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)).max()
        nan_rows = int(np.isnan(out).any(-1).sum())
        ratio = np.nan if nan_rows else max(x.max_err / x.allowed
                                            for x in check_forward(q, k, v, out, lse))
        rows.append((logit, ratio, nan_rows))
    return np.array(rows)


real = sweep("wgmma16")
careless = None
if numba_flash.SIMULATOR:
    with mutants.registered("S held in float16 (wgmma16)") as careless_pair:
        careless = sweep(careless_pair)
print(f"{'max q k^T':>10} {'wgmma16 err/allowed':>20} {'S in float16: err/allowed, NaN rows':>36}")
for i, (logit, ratio, _) in enumerate(real):
    other = "" if careless is None else f"{careless[i, 1]:>24.3f} {int(careless[i, 2]):>11}"
    print(f"{logit:>10.0f} {ratio:>20.3f} {other}")

fig, ax = plt.subplots(figsize=(6.5, 3.6))
ax.plot(real[:, 0], real[:, 1], marker="o", label="wgmma16 (S in float32)")
if careless is not None:
    nan = careless[:, 2] > 0
    ax.plot(careless[~nan, 0], careless[~nan, 1], marker="s", label="mutant: S held in float16")
    ax.scatter(careless[nan, 0], np.full(nan.sum(), 2.0), marker="x", color="C3", zorder=3,
               label="mutant: NaN rows (drawn at 2)")
ax.axvline(65504, color="grey", ls="--", lw=1)
ax.text(65504 * 1.15, 1e-3, "float16's\nlargest, 65504", color="grey", fontsize=8)
ax.axhline(1.0, color="k", lw=0.8)
ax.set_xscale("log"), ax.set_yscale("log"), ax.set_ylim(1e-4, 4)
ax.set_xlabel("largest logit max(q kᵀ), float16 inputs"), ax.set_ylabel("worst error / allowed")
ax.legend(fontsize=8, loc="lower left")
show(fig, "half-overflow")

# %% [markdown]
# **Check the claim.**

# %%
assert outcomes and not failures, [f.report() for f in failures]
assert {o.kernel for o in outcomes} == set(registry.PAIRS), {o.kernel for o in outcomes}
assert any(f.kernel == broken for f in m_fail) and replay_rc == 1
assert {"float16", "bfloat16"} <= {o.problem.dtype for o in outcomes}
assert (real[:, 2] == 0).all() and (real[:, 1] <= 1).all() and real[-1, 0] > 4 * 65504
if careless is not None:    # the mutant is an edit of the simulator's model
    past = careless[:, 0] > 65504
    assert past.any() and (~past).any()
    assert (careless[past, 2] > 0).all() and (careless[~past, 2] == 0).all()
    assert (careless[~past, 1] <= 1).all()    # exact enough below 65504: only overflow shows
print("claim holds")
