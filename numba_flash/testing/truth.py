"""Where the float64 truth is computed: the reference's formulas (reference.attention_forward
and attention_backward, which take an array namespace `xp`) run on the GPU when one is there.

`namespace()` picks the fastest of: CuPy (if importable and it sees a GPU), torch (if
importable with CUDA), NumPy. The tolerance rule (tolerance.py) is unchanged by the choice:
only truth one precision up in float64 (that of float32 kernels) can move; the long double
truth of float64 kernels has no GPU type and stays in NumPy, as does NumPy's same-precision
attention that the rule measures the kernels against.
"""

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

import reference as ref


@dataclass(frozen=True)
class Namespace:
    """An array namespace for the reference: `xp` (NumPy's names: swapaxes, where, exp, log,
    amax, sum, arange), `asarray` (NumPy array to it) and `to_numpy` (back)."""
    name: str
    xp: object
    asarray: Callable
    to_numpy: Callable

    @property
    def on_gpu(self):
        return self.name != "numpy"


NUMPY = Namespace("numpy", np, np.asarray, np.asarray)


class TorchNumpy:
    """The NumPy names the reference uses, on torch tensors of one CUDA device (torch's
    reductions take dim/keepdim, and its arange is on the CPU by default)."""

    def __init__(self, torch, device="cuda"):
        self.torch, self.device = torch, device
        self.swapaxes, self.where, self.exp, self.log = (
            torch.swapaxes, torch.where, torch.exp, torch.log)

    def amax(self, x, axis, keepdims=False):
        return self.torch.amax(x, dim=axis, keepdim=keepdims)

    def sum(self, x, axis, keepdims=False):
        return self.torch.sum(x, dim=axis, keepdim=keepdims)

    def arange(self, n):
        return self.torch.arange(n, device=self.device)


def _cupy():
    import cupy
    if cupy.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("CuPy sees no GPU")
    return Namespace("cupy", cupy, cupy.asarray, cupy.asnumpy)


def _torch():
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch has no CUDA")
    return Namespace("torch", TorchNumpy(torch),
                     lambda a: torch.from_numpy(np.ascontiguousarray(a)).to("cuda"),
                     lambda t: t.cpu().numpy())


@functools.lru_cache(maxsize=None)
def namespace(prefer=None):
    """The Namespace float64 truth is computed in here: CuPy, else torch with CUDA, else NumPy
    (always NumPy on the CUDA simulator). prefer: "cupy", "torch" or "numpy" to ask for one
    (ValueError when it cannot be had)."""
    import numba_flash
    makers = {"cupy": _cupy, "torch": _torch, "numpy": lambda: NUMPY}
    if prefer is not None:
        if prefer not in makers:
            raise ValueError(f"unknown array namespace {prefer!r}; choose from {sorted(makers)}")
        try:
            return makers[prefer]()
        except Exception as e:          # ImportError, no device, a driver error
            raise ValueError(f"array namespace {prefer!r} is not usable here: {e}") from e
    if numba_flash.SIMULATOR:
        return NUMPY
    for make in (_cupy, _torch):
        try:
            return make()
        except Exception:               # not installed, or no device it can use
            continue
    return NUMPY


def attention_forward(q, k, v, *, causal=False, scale=None, ns=NUMPY):
    """reference.attention_forward on NumPy arrays (k, v with q's heads), computed in
    Namespace `ns` in the arrays' dtype; NumPy arrays (out, lse) back."""
    args = [ns.asarray(a) for a in (q, k, v)]
    return tuple(ns.to_numpy(a) for a in
                 ref.attention_forward(*args, causal=causal, scale=scale, xp=ns.xp))


def attention_backward(dout, q, k, v, *, causal=False, scale=None, ns=NUMPY):
    """reference.attention_backward on NumPy arrays (k, v with q's heads), computed in
    Namespace `ns` in the arrays' dtype; NumPy arrays (dq, dk, dv) back."""
    args = [ns.asarray(a) for a in (dout, q, k, v)]
    return tuple(ns.to_numpy(a) for a in
                 ref.attention_backward(*args, causal=causal, scale=scale, xp=ns.xp))
