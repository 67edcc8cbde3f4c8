"""Hypothesis settings profiles: ci, dev, gpu, nightly.

ci       derandomized, few examples, simulator sizes: what CI runs.
dev      more examples, simulator sizes: a researcher's laptop after a kernel change.
gpu      real sizes, 20 examples per property and kernel: minutes on a GPU (truth in long
         double for float64 kernels is computed on the CPU, which is most of the time). No
         shrinking: each shrink step at real sizes compiles a new shape, and on the H200 one
         failing property shrank for minutes past a run's time limit before it could report.
nightly  thousands of examples at real sizes; every property calls target() with its
         error / allowed ratio, so Hypothesis steers toward the largest relative error.
Load one with HYPOTHESIS_PROFILE=name (tests) or `numba-flash fuzz --profile name`.
"""

import os

from hypothesis import HealthCheck, Phase, settings

_COMMON = dict(deadline=None, print_blob=True, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])

settings.register_profile("ci", max_examples=3, derandomize=True, database=None, **_COMMON)
settings.register_profile("dev", max_examples=40, **_COMMON)
settings.register_profile("gpu", max_examples=20,
                          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
                          **_COMMON)
settings.register_profile("nightly", max_examples=3000, **_COMMON)

SIZE = {"ci": "simulator", "dev": "simulator", "gpu": "gpu", "nightly": "gpu"}


def load(name=None, simulator=True):
    """Load profile `name` (default: $HYPOTHESIS_PROFILE, else ci on the simulator, gpu on a
    GPU) and return (name, size) where size is a key of strategies.SIZES."""
    name = name or os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if simulator else "gpu")
    if name not in SIZE:
        raise ValueError(f"unknown profile {name!r}; choose from {sorted(SIZE)}")
    settings.load_profile(name)
    return name, SIZE[name]
