# %% [markdown]
# # 5. Fuzzing for overflow, and a broken kernel caught
#
# **Claim.** A short Hypothesis campaign over random shapes, tiles and logit regimes (up to
# |S| ~ 1e4 in float32, where exp overflows many times over) finds no failure in the registered
# kernels; the same campaign catches a kernel that forgets to rescale l when the running max
# grows, and saves a reproducer that `numba-flash replay` re-runs.

# %%
import tempfile

import numba_flash
from numba_flash import cli
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
for o in worst:
    print(f"{o.worst:.3f}  {o.prop} [{o.kernel}] {o.problem.describe()}")

# %% [markdown]
# Now a mutant: `l *= alpha` removed from the row-per-thread kernel. Hypothesis starts from
# small problems (one K/V tile, where m never grows), so the campaign gets 40 examples on the
# mutant alone (tests/test_mutants.py shows 40 are enough for every mutant; 20 at real sizes,
# where there are many K/V tiles).

# %%
repro_dir = tempfile.mkdtemp()
with mutants.registered("l not rescaled when m grows") as broken:
    m_out, m_fail, paths = campaign.fuzz(size, examples=40 if numba_flash.SIMULATOR else 20,
                                         progress=False, directory=repro_dir,
                                         properties=["forward agrees"], kernels=[broken])
    print(f"{len(m_fail)} failing examples of {len(m_out)}; first: {m_fail[0].report() if m_fail else None}")
    replay_rc = cli.main(["replay", paths[0]]) if paths else None

# %% [markdown]
# **Check the claim.**

# %%
assert outcomes and not failures, [f.report() for f in failures]
assert any(f.kernel == broken for f in m_fail) and replay_rc == 1
print("claim holds")
