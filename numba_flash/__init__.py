"""numba-flash: FlashAttention forward and backward as Numba CUDA kernels.

Without a CUDA GPU (and with NUMBA_ENABLE_CUDASIM unset) importing numba_flash turns on
Numba's CUDA simulator, so every kernel still runs, slowly, on the CPU; SIMULATOR says which.
"""

from ._gpu import cuda_gpu_present, use_simulator_without_gpu

SIMULATOR = use_simulator_without_gpu()   # must precede the first import of numba.cuda

from .api import flash_attention_backward, flash_attention_forward  # noqa: E402

__all__ = ["SIMULATOR", "cuda_gpu_present", "flash_attention_backward", "flash_attention_forward"]
