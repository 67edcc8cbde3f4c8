"""Forward plans: an API forward on torch tensors replayed from the one launch it made.

Most of the host time of flash_attention_forward on torch CUDA tensors goes to work whose
answer does not change from call to call: the checks, the registry, the arrays' views, the
kernel's specialization, alignment and tensor maps, the arguments' packing. At a size where
the host bounds the loop (B = 1, H = 2, N = 128, wgmma16, bf16, causal) a forward took 158 us
of host, its launches left out 124 of them, and torch's flash SDPA 21 (an H100's host,
2026-12-06 17:18, tools/host_pieces.py). At the benchmark's causal N = 1k a forward's kernel
is ~240 us: that host time is what a synchronized call adds to it.

A call whose inputs match a remembered call's in everything that work reads makes the same
launch but for the outputs' pointers: the tensors' data pointers, shapes, dtypes, device,
contiguity and requires_grad; the options (causal, scale, tiles, kernel: each of a plain
scalar type); the current stream and CUDA context; the registry's generation and the pair's
identity (`key`). Such a call here allocates out and lse and launches the remembered packed
arguments with their pointers written in (`Plan.run`): the checks it skips passed for the
remembered call and read nothing that differs.

A plan is made (`remember`) only of a call on a GPU whose pair marks its forward replayable
(registry.Pair.replay_forward), that made exactly one launch, packed by the Launcher
(launch.recording), whose arguments are views of q, k, v (their pointers are in the key), out
and lse (written anew at each replay), memory the plan holds (the tensor maps) and scalars.
Half inputs on a pair that widens them (two more launches, a workspace) make none; nor does
any other kind of array.
"""

import sys

from . import registry
from .arrays import AllocationMeter
from .kernels.launch import SIMULATOR, VIEW_PTR, DeviceView, current_context

# a process that meets many inputs (training without a caching allocator's reuse) makes a
# plan a call: the dict is cleared at this size
PLAN_ENTRIES = 256
_plans = {}

# out and lse of a replay must be aligned to this many bytes, as the remembered call's were
# (torch's caching allocator hands out 512-byte aligned blocks): the kernels choose their
# code by 16-byte alignment (vector_io.aligned, tma.tma_ready)
ALIGN = 256

# the types a keyed option may have: immutable scalars (a 0-d tensor as scale can change in
# place, and is hashed by its identity); `type` for the options' own types
_OPTION_TYPES = frozenset((type(None), bool, int, float, str, type))


def _torch_tensor():
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def key(q, k, v, options):
    """The plan key of a forward on q, k, v with `options` (api's tuple of values and their
    types), or None where no plan can serve: not three plain torch CUDA tensors, an option
    that is not a plain scalar, the simulator."""
    tensor = _torch_tensor()
    if (SIMULATOR or tensor is None or type(q) is not tensor or type(k) is not tensor
            or type(v) is not tensor):
        return None
    for o in options:
        if type(o) not in _OPTION_TYPES:
            return None
    device = q.get_device()
    if device < 0:
        return None
    try:
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr())   # (sparse tensors: none)
    except RuntimeError:
        return None
    import torch
    return (options, pointers, q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, device,
            k.get_device(), v.get_device(), q.is_contiguous(), k.is_contiguous(),
            v.is_contiguous(), q.requires_grad, k.requires_grad, v.requires_grad,
            torch._C._cuda_getCurrentRawStream(device), current_context(),
            registry.generation())


class Plan:
    """One remembered forward: run() allocates out and lse as the remembered call returned
    them and makes its launch with their pointers written at out_at and lse_at, the packed
    positions of the views of out and of lse (module docstring)."""

    __slots__ = ("pair", "kernel", "config", "stream", "packed", "out_at", "lse_at",
                 "out_like", "lse_like", "held", "nbytes")

    def __init__(self, pair, launch, out_at, lse_at, out, lse, held):
        # the launch's packed values, not its arguments: those hold the call's tensors (its
        # inputs and outputs), which a plan must not keep alive
        self.pair, self.held = pair, held
        self.kernel, self.config, self.stream = launch.kernel, launch.config, launch.stream
        self.packed = launch.packed
        self.out_at, self.lse_at = out_at, lse_at
        self.out_like = (tuple(out.shape), out.dtype, out.device)
        self.lse_like = (tuple(lse.shape), lse.dtype, lse.device)
        self.nbytes = out.nbytes + lse.nbytes

    def run(self):
        """(out, lse) as the API returns them, or None where the plan does not serve (the
        pair was replaced in the registry by hand; an output not aligned as the remembered
        call's was): the caller then runs the call in full."""
        import torch
        from cuda.core import launch
        if registry.PAIRS.get(self.pair.name) is not self.pair:
            return None
        shape, dtype, device = self.out_like
        out = torch.empty(shape, dtype=dtype, device=device)
        shape, dtype, device = self.lse_like
        lse = torch.empty(shape, dtype=dtype, device=device)
        o, m = out.data_ptr(), lse.data_ptr()
        if (o | m) % ALIGN:
            return None
        packed = list(self.packed)
        for i in self.out_at:
            packed[i] = o
        for i in self.lse_at:
            packed[i] = m
        launch(self.stream, self.config, self.kernel, *packed)
        for meter in AllocationMeter.active:
            meter.bytes += self.nbytes
        return out, lse


def run(plan_key):
    """The remembered plan's (out, lse) for plan_key, or None (no plan, or it does not
    serve)."""
    plan = _plans.get(plan_key)
    return None if plan is None else plan.run()


def remember(plan_key, pair, launches, inputs, out, lse):
    """Make and keep the plan of a forward that passed its checks and made `launches`
    (launch.recording's list) on inputs (q, k, v) returning out, lse; nothing where the call
    cannot be replayed (module docstring)."""
    if plan_key is None or not pair.replay_forward or len(launches) != 1 or launches[0] is None:
        return
    tensor = _torch_tensor()
    if type(out) is not tensor or type(lse) is not tensor:
        return
    L = launches[0]
    inputs = {x.data_ptr() for x in inputs}
    o, m = out.data_ptr(), lse.data_ptr()
    if (o | m) % ALIGN:
        return
    found, held = {o: [], m: []}, []
    for a, start in zip(L.args, L.starts):
        if type(a) is not DeviceView:
            if isinstance(a, (DeviceView, tensor)) or hasattr(a, "__cuda_array_interface__"):
                return          # (a kind of array the Launcher packed as a scalar: none today)
            continue            # a scalar: kept as packed
        if a.ptr in found:      # (the kernels without TMA take lse twice, in place of maps)
            if a.nbytes != (out if a.ptr == o else lse).nbytes:
                return
            found[a.ptr].append(start + VIEW_PTR)
        elif a.ptr in inputs:
            continue            # keyed: the same memory at every replay
        elif a.pool_owner is None and type(a.owner) is not tensor:
            held.append(a)      # memory of its own (the tensor maps): kept alive with the plan
        else:
            return              # a workspace from the pool: freed after the call
    if o == m or not (found[o] and found[m]):
        return
    if len(_plans) >= PLAN_ENTRIES:
        _plans.clear()
    _plans[plan_key] = Plan(pair, L, tuple(found[o]), tuple(found[m]), out, lse, tuple(held))


def clear():
    """Forget every plan (the tests, and a process that wants its memory back)."""
    _plans.clear()
