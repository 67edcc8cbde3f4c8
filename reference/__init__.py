"""Pure-NumPy reference of every algorithm in the FlashAttention papers (float64 by default:
each function keeps the dtype it is given)."""

from .attention import (attention_backward, attention_forward, blocked_attention, causal_mask,
                        default_scale, repeat_kv, sum_kv_groups)
from .cost import (attention_memory, backward_flops, forward_flops, hbm_accesses_flash,
                   hbm_accesses_standard, hbm_crossover, recompute_flop_ratio, visible_pairs)
from .flash import flash_backward, flash_forward
from .half import (attention_backward_half, attention_forward_half, flash_backward_half,
                   flash_forward_half)
from .precision import (matmul_3xtf32, matmul_fma_order, round_half, round_tf32, split_tf32,
                        step_3xtf32)
from .softmax import (naive_softmax, online_softmax, online_softmax_stats,
                      online_softmax_stats_blocked, safe_softmax)

__all__ = [
    "attention_backward", "attention_forward", "blocked_attention", "causal_mask",
    "default_scale", "repeat_kv", "sum_kv_groups",
    "attention_memory", "backward_flops", "forward_flops", "hbm_accesses_flash",
    "hbm_accesses_standard", "hbm_crossover", "recompute_flop_ratio", "visible_pairs",
    "flash_backward", "flash_forward",
    "attention_backward_half", "attention_forward_half", "flash_backward_half",
    "flash_forward_half",
    "matmul_3xtf32", "matmul_fma_order", "round_half", "round_tf32", "split_tf32", "step_3xtf32",
    "naive_softmax", "online_softmax", "online_softmax_stats", "online_softmax_stats_blocked",
    "safe_softmax",
]
