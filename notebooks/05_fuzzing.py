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
# dtypes and logit regimes, from ordinary logits to |S| ~ 1e4 in float32, where exp overflows
# many times over. A short campaign of them finds no failure, forward or backward, in any
# registered kernel pair (`numba_flash.registry.PAIRS`: `rowwise`, `tiled`, `fa2`, `wgmma`);
# the same campaign catches a forward that forgets to rescale l when the running max grows, and
# saves a reproducer that `numba-flash replay` re-runs (it fails again).
#
# On the CUDA simulator the campaign over the pairs is short indeed: 2 examples per (property,
# pair), Hypothesis's first and smallest, derandomized (the test suite's `ci` profile runs 3 per
# property and pair, `tests/test_properties.py`). The mutant gets 40, enough to reach the
# large-logit regimes that expose it.

# %%
import tempfile
from collections import Counter

import numba_flash
from numba_flash import cli, registry
from numba_flash.testing import campaign, mutants, profiles

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
      dict(Counter(o.problem.regime for o in outcomes)))
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
# **Check the claim.**

# %%
assert outcomes and not failures, [f.report() for f in failures]
assert {o.kernel for o in outcomes} == set(registry.PAIRS), {o.kernel for o in outcomes}
assert any(f.kernel == broken for f in m_fail) and replay_rc == 1
print("claim holds")
