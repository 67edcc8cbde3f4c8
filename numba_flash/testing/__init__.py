"""Public testing helpers: tolerance against float64 truth and named problems."""

from .cases import GPU_CASES, SIMULATOR_CASES, Case
from .tolerance import (FORWARD_MULTIPLE, GRADIENT_MULTIPLE, Comparison, assert_within_tolerance,
                        check_backward, check_forward, compare)

__all__ = ["GPU_CASES", "SIMULATOR_CASES", "Case", "FORWARD_MULTIPLE", "GRADIENT_MULTIPLE",
           "Comparison", "assert_within_tolerance", "check_backward", "check_forward", "compare"]
