"""Public testing helpers: tolerance against truth, named cases, Hypothesis strategies and
profiles, the properties every kernel must have, fuzz campaigns and mutants.

    from numba_flash.testing import problems, PROPERTIES, check_forward
"""

from .campaign import check_kernel
from .cases import GPU_CASES, SIMULATOR_CASES, Case
from .properties import PROPERTIES, Outcome
from .strategies import REGIMES, Problem, logits_regime, problems
from .tolerance import (FORWARD_MULTIPLE, GRADIENT_MULTIPLE, Comparison, assert_within_tolerance,
                        check_backward, check_forward, compare)

__all__ = ["check_kernel", "GPU_CASES", "SIMULATOR_CASES", "Case", "PROPERTIES", "Outcome", "REGIMES", "Problem",
           "logits_regime", "problems", "FORWARD_MULTIPLE", "GRADIENT_MULTIPLE", "Comparison",
           "assert_within_tolerance", "check_backward", "check_forward", "compare"]
