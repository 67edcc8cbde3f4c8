from ._gpu import cuda_gpu_present  # noqa: F401
