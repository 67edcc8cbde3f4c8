"""numba-flash in torch: `flash_attention`, a differentiable attention function in SDPA's layout,
built on two `torch.library` custom ops, so that autograd and `torch.compile(fullgraph=True)`
see one op each way.

    from numba_flash.torch import flash_attention
    out = flash_attention(q, k, v, causal=True)        # q (B, H, Nq, d), k and v (B, Hk, Nk, d)
    out.sum().backward()                               # dq, dk, dv by the registered backward

- The ops are `torch.ops.numba_flash.forward(q, k, v, causal, scale, kernel, deterministic)
  -> (out, lse)` and `torch.ops.numba_flash.backward(dout, q, k, v, out, lse, causal, scale,
  kernel, deterministic) -> (dq, dk, dv)`, each with a fake (meta) implementation for tracing.
  The backward follows the forward that ran: the same kernel name resolves to the same pair
  (registry.resolve), whose backward recomputes P from lse as its forward formed S.
- CUDA tensors run on torch's current stream, outputs from torch's caching allocator
  (numba_flash.arrays). CPU tensors run the same kernels on Numba's CUDA simulator, where
  there is no GPU (tiny sizes: for tests and CI); with a GPU they are a ValueError.
- Inputs with other strides (the views a model makes of a fused QKV projection) are copied
  to contiguous ones first: one extra read and write of that tensor (B·H·N·d elements) per
  call, in each direction that takes it.
- float16, bfloat16, float32 and float64 (half inputs as the plain API runs them: on an H200
  the 16-bit Hopper pairs, else widened to float32 on the device; results in the inputs'
  dtype); lse, the second output of the forward op (float32 for half inputs), is not
  differentiable.
"""

import math

import ml_dtypes
import numpy as np
import torch

from . import SIMULATOR
from .api import flash_attention_backward, flash_attention_forward


def _run(fn, tensors, **kw):
    """fn (the API) on contiguous tensors: CUDA tensors as they are, CPU tensors through NumPy
    on the simulator; results as tensors on the inputs' device."""
    tensors = [t.detach().contiguous() for t in tensors]
    if tensors[0].is_cuda:
        return fn(*tensors, **kw)
    if not SIMULATOR:
        raise ValueError("numba_flash.torch: CPU tensors run on Numba's CUDA simulator, which "
                         "is on only without a GPU; move q, k, v to the GPU (.cuda())")
    return tuple(_from_numpy(r) for r in fn(*(_to_numpy(t) for t in tensors), **kw))


def _to_numpy(t):
    """A CPU tensor as a NumPy array (bfloat16 as ml_dtypes', which torch cannot make)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _from_numpy(a):
    a = np.ascontiguousarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _lse_dtype(q):
    """lse's dtype: float32 for half q (its kernels' dtype), else q's."""
    return torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype


@torch.library.custom_op("numba_flash::forward", mutates_args=())
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
            kernel: str, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, Nq, d), lse (B, H, Nq)) of the registered forward `kernel`;
    deterministic is kept for the backward (the forward has no atomics)."""
    return _run(flash_attention_forward, (q, k, v), causal=causal, scale=scale,
                kernel=kernel)


@forward.register_fake
def _(q, k, v, causal, scale, kernel, deterministic):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=_lse_dtype(q))


@torch.library.custom_op("numba_flash::backward", mutates_args=())
def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float, kernel: str,
             deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the registered backward of `kernel`, from the forward's out and lse."""
    return _run(flash_attention_backward, (dout, q, k, v, out, lse), causal=causal,
                scale=scale, kernel=kernel, deterministic=deterministic)


@backward.register_fake
def _(dout, q, k, v, out, lse, causal, scale, kernel, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, kernel, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = (causal, scale, kernel, deterministic)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = backward(dout, q, k, v, out, lse, *ctx.options)
    return dq, dk, dv, None, None, None, None


forward.register_autograd(_backward, setup_context=_setup_context)


def flash_attention(q, k, v, *, causal=False, scale=None, kernel="auto", deterministic=False):
    """softmax(scale · q kᵀ (masked)) v with gradients for q, k and v, in SDPA's layout.

    q (B, H, Nq, d), k and v (B, Hk, Nk, d) torch tensors of one dtype (float16, bfloat16,
    float32 or float64)
    on one device, Hk dividing H (grouped-query attention: query heads h·Hk/H .. share key
    head h); any strides. causal masks key j for query i when j > i + Nk - Nq (bottom-right,
    as the plain API; SDPA's is_causal is top-left: the same when Nq = Nk). scale defaults to
    1/sqrt(d). kernel and deterministic: as in numba_flash.flash_attention_forward /
    flash_attention_backward. Returns out (B, H, Nq, d).
    """
    for name, flag in (("causal", causal), ("deterministic", deterministic)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    elif isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.floating,
                                                                       np.integer)):
        raise TypeError(f"scale must be a real number, got {scale!r}")
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a registered name (a str), got {kernel!r}")
    out, _ = forward(q, k, v, bool(causal), float(scale), kernel, bool(deterministic))
    return out
