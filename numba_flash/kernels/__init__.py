"""The kernel registry: every variant registered here runs through the same checks
(`numba-flash verify`, the tests, the fuzzer) and the same benchmark.

A forward variant is a factory make_kernel(block_m, block_n, head_dim, causal, dtype) ->
(kernel, threads_per_block), launched on grid (ceil(Nq / block_m), B*H) with arguments
(q, k, v, out, lse, scale, heads, group) on 3-D arrays (B*H, N, d), plus default_blocks(head_dim,
dtype) -> (block_m, block_n). The kernel is a Numba dispatcher or anything launched the same way,
kernel[grid, threads](*args): common.DynamicSharedKernel wraps one that needs more than 48 KiB
of shared memory (forward_fa2.py). To add one: copy forward_rowwise.py, change it, and call
register_forward("my-name", module.make_forward_kernel, module.default_blocks).

A backward variant is run(dout, q, k, v, lse, out, dq, dk, dv, *, scale, heads, group, causal,
block_m, block_n), launching whatever it needs on 3-D device arrays, plus default_blocks. A
variant whose results depend on the order of atomics names, as when_deterministic, a registered
variant without them; the API runs that one instead (with its own default tiles) when
deterministic=True is asked.
"""

import functools
from dataclasses import dataclass
from typing import Callable

from . import (backward, backward_fa2, backward_wgmma, forward_fa2, forward_rowwise, forward_tiled,
               forward_wgmma)


@dataclass(frozen=True)
class ForwardVariant:
    name: str
    make_kernel: Callable
    default_blocks: Callable


FORWARD = {}


def register_forward(name, make_kernel, default_blocks):
    """Add a forward kernel variant under `name` (replacing any of that name)."""
    FORWARD[name] = ForwardVariant(name, make_kernel, default_blocks)
    return FORWARD[name]


register_forward("rowwise", forward_rowwise.make_forward_kernel, forward_rowwise.default_blocks)
register_forward("tiled", forward_tiled.make_forward_kernel, forward_tiled.default_blocks)
register_forward("fa2", forward_fa2.make_forward_kernel, forward_fa2.default_blocks)

# Hopper warpgroup products (forward_wgmma, 3xTF32 on wgmma) where they apply (float32, d <= 64;
# forward_wgmma_wide for 64 < d <= 128; an sm_90 GPU or the simulator), fa2 elsewhere; its S
# is the "wgmma" backward's bit for bit
register_forward("wgmma", forward_wgmma.make_forward_kernel,
                 forward_wgmma.default_blocks_or_fallback)

DEFAULT_FORWARD = "fa2"


@dataclass(frozen=True)
class BackwardVariant:
    name: str
    run: Callable
    default_blocks: Callable
    when_deterministic: str = None
    forward: str = None


BACKWARD = {}


def register_backward(name, run, default_blocks, when_deterministic=None, forward=None):
    """Add a backward kernel variant under `name` (replacing any of that name). forward: the
    registered forward it is made to follow (one that computes S as it does); `verify` feeds it
    that forward's out and lse and the benchmark times the two together (None: the default)."""
    BACKWARD[name] = BackwardVariant(name, run, default_blocks, when_deterministic, forward)
    return BACKWARD[name]


register_backward("tiled", backward.run_backward, backward.default_blocks)
register_backward("fa2", backward_fa2.run_backward, backward_fa2.default_blocks)
# dQ accumulated by the dK/dV kernel with atomics (5 matmuls' work, not 7): the default since
# its GPU runs on 2026-11-29 (README, Numbers); deterministic=True runs fa2 instead. In float32
# its accumulating products run on tensor cores (3xTF32; backward_fa2.tensor_cores_by_default)
register_backward("fa2-atomic", functools.partial(backward_fa2.run_backward, dq_atomic=True),
                  backward_fa2.default_blocks_atomic, when_deterministic="fa2")
# fa2-atomic with every product an FFMA sum (tensor_cores=False): the default until the
# tensor-core products were timed ahead of it (2026-11-29), kept to compare against
register_backward("fa2-ffma", functools.partial(backward_fa2.run_backward, dq_atomic=True,
                                                tensor_cores=False),
                  backward_fa2.default_blocks_atomic, when_deterministic="fa2")
# Hopper warpgroup products (backward_wgmma.make_lean_kernel, 3xTF32 on wgmma, two blocks per
# SM; backward_wgmma_wide for 64 < d <= 128) where they apply (float32, d <= 128, an sm_90 GPU
# or the simulator), fa2-atomic elsewhere; it recomputes S bit for bit as the wgmma forward
# computed it
register_backward("wgmma", backward_wgmma.run_or_fallback,
                  backward_wgmma.default_blocks_or_fallback, when_deterministic="fa2",
                  forward="wgmma")

DEFAULT_BACKWARD = "fa2-atomic"


def forward_for(backward):
    """The registered forward whose out and lse the named backward should consume: the one it
    follows (BackwardVariant.forward), else DEFAULT_FORWARD (also for names not registered)."""
    variant = BACKWARD.get(backward)
    return (variant.forward if variant is not None else None) or DEFAULT_FORWARD
