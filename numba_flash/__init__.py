"""numba-flash: FlashAttention forward and backward as Numba CUDA kernels."""

from ._gpu import cuda_gpu_present  # noqa: F401  (imports no numba.cuda)
from .api import flash_attention_backward, flash_attention_forward

__all__ = ["flash_attention_backward", "flash_attention_forward", "cuda_gpu_present"]
