"""The registry of kernel pairs: what `kernel=` names.

A registered name is a Pair: a forward kernel factory and the backward that follows it (it
recomputes P from the forward's lse, forming S as that forward formed it), their default tiles,
and `can_run(d, dtype, device)`. The API asks `resolve(name, d, dtype)` for the pair to run:

- "auto" (the default) is the first pair of `auto_order(device)` that can run the case: the
  fastest measured there (on an H200, the Hopper pairs; docs/performance.md);
- a pair that cannot run a case falls back to its `fallback` (wgmma16 -> wgmma -> fa2,
  mma16 -> fa2), here
  and nowhere else, so that the forward and the backward of one call resolve to the same
  pair.

A user's variant is a Pair too: `register(variant("mine", "tiled", make_forward=...))`
(README, "Changing a kernel"); every check (tests, `numba-flash verify`, the fuzzer, the
benchmark) runs on what is registered.

device strings: "simulator", or "sm_XY" for a GPU of compute capability X.Y.
"""

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from reference.precision import half_format

from .kernels import backward, backward_fa2, forward_fa2, forward_rowwise, forward_tiled
from .kernels.sm90 import backward as backward_wgmma, backward16, forward as forward_wgmma
from .kernels.sm90 import forward16
from .kernels.support import (SHARED_PER_BLOCK, SHARED_PER_BLOCK_LEAST, SIMULATOR,
                              SUPPORTED_DTYPES, dynamic_shared_limit)


def current_device():
    """"simulator", or "sm_XY" for the current GPU."""
    if SIMULATOR:
        return "simulator"
    from numba import cuda
    major, minor = cuda.get_current_device().compute_capability
    return f"sm_{major}{minor}"


def anywhere(d, dtype, device):
    """can_run of the portable pairs: every dtype the API takes (float32, float64), d <= 256."""
    return np.dtype(dtype) in SUPPORTED_DTYPES


@dataclass(frozen=True)
class Pair:
    """A forward and the backward that follows it, with one frozen configuration.

    make_forward(block_m, block_n, d, causal, dtype) -> (kernel, threads): kernel[grid,
        threads](q, k, v, out, lse, scale, heads, group) on (B*H, N, d) device arrays, grid
        (ceil(Nq / block_m), B*H); ValueError for tiles it cannot take.
    run_backward(dout, q, k, v, lse, out, dq, dk, dv, *, scale, heads, group, causal, block_m,
        block_n, deterministic, stream): launches what it needs on 3-D device arrays (dq, dk,
        dv written; deterministic=True: no atomics, bitwise reproducible), every kernel on
        `stream` (kernel[grid, block, stream]: the caller's framework's current stream).
    forward_tiles(d, dtype), backward_tiles(d, dtype, deterministic) -> (block_m, block_n).
    check_backward_tiles(block_m, block_n, d, dtype, deterministic): ValueError for tiles the
        backward cannot take (None: only its default tiles).
    can_run(d, dtype, device) -> bool; fallback: the pair to run where it cannot.
    fixed_tiles: the pair has one tile shape per (d, dtype) (no tile invariance to test).
    atomic_dq: dq is added with atomics unless deterministic=True (not bitwise reproducible).
    exact_infinities: an infinite entry of q or k gives what IEEE arithmetic on q k^T gives
    (a logit of -inf: a masked key); False for pairs whose products split float32 into TF32
    parts on tensor cores, where inf's small part is NaN and such rows come out NaN (the
    "non-finite inputs" properties allow them NaN there, never a finite answer).
    half_inputs: for half inputs (widened to float32 by the API) make_forward takes the half
        dtype and run_backward half=True, so that the kernels may skip the products of the
        inputs' zero small parts (they are exact in TF32); False: they get float32 as for
        float32 inputs.
    half_storage: make_forward takes the half dtype and its kernel reads q, k, v as they are
        stored (16-bit patterns: uint16 views) and writes out in that format (no widened
        copies, no narrowing); run_backward gets dout, q, k, v, out so too, and fmt=
        ("float16" or "bfloat16"), and writes dk, dv in that format (uint16 views; dq float32
        as ever); can_run sees the half dtype itself (other pairs see float32).
    replay: make_forward's kernel and run_backward do nothing at a call but launch through
        Launchers and allocate through arrays.empty_device (no Python of their own whose
        effects a call needs, no memory set or copied another way), so the API may replay a
        call on torch tensors from what a matching call did (numba_flash.replay). True for
        the registered pairs; variant() sets it False when it replaces either.
    """
    name: str
    make_forward: Callable
    run_backward: Callable
    forward_tiles: Callable
    backward_tiles: Callable
    check_backward_tiles: Callable = None
    can_run: Callable = anywhere
    fallback: str = None
    fixed_tiles: bool = False
    atomic_dq: bool = False
    exact_infinities: bool = True
    half_inputs: bool = False
    half_storage: bool = False
    replay: bool = False
    summary: str = ""

    def accepts(self, kind, block_m, block_n, d, dtype, deterministic=False):
        """True when the pair's forward (kind "forward") or backward takes these tiles."""
        try:
            if kind == "forward":
                self.make_forward(block_m, block_n, d, False, np.dtype(dtype))
            elif self.check_backward_tiles is not None:
                self.check_backward_tiles(block_m, block_n, d, np.dtype(dtype), deterministic)
            else:
                return (block_m, block_n) == self.backward_tiles(d, np.dtype(dtype),
                                                                 deterministic)
        except ValueError:
            return False
        return True


# changed through register and unregister only: the API remembers resolutions and notices a
# hand-made change only to the pair a name resolved to
PAIRS = {}
_generation = [0]


def generation():
    """A number that changes whenever register or unregister changes PAIRS: the API's memo of
    what a call resolved to (api._recall) holds only within one generation."""
    return _generation[0]


def register(pair):
    """Add `pair` under pair.name (replacing any of that name); returns it."""
    if not isinstance(pair, Pair):
        raise TypeError(f"register takes a registry.Pair, got {type(pair).__name__}")
    PAIRS[pair.name] = pair
    _generation[0] += 1
    return pair


def unregister(name):
    PAIRS.pop(name, None)
    _generation[0] += 1


def variant(name, base, **changes):
    """A copy of registered pair `base` under `name` with fields replaced (make_forward=,
    run_backward=, ...), for a changed kernel; it takes over base's tiles and can_run, and
    has no fallback (a variant that cannot run a case says so); half_inputs is copied too, so a
    variant of wgmma gets the half dtype in make_forward (pass half_inputs=False if its kernels
    cannot take it); replay is False when make_forward or run_backward is replaced (pass
    replay=True for kernels that only launch and allocate, as Pair.replay says)."""
    if "make_forward" in changes or "run_backward" in changes:
        changes = {"replay": False, **changes}
    return dataclasses.replace(PAIRS[base], name=name, **{"fallback": None, **changes})


def auto_order(device):
    """The pairs "auto" tries, fastest first (each can_run decides whether it takes the case).
    On an sm_90 GPU the Hopper pairs: for half inputs wgmma16 (forward and backward on 16-bit
    products: 1.02-1.97x wgmma16-tf32bwd in forward+backward, d = 64 and 128, on the H200 in
    bfloat16, 2026-12-04 05:49 UTC, before its two-warpgroup blocks made it faster); for
    float32 wgmma (1.3-1.6x fa2 in forward+backward; docs/performance.md). On other GPUs
    (sm_80 and later) mma16 for half inputs (the same 16-bit kernels on mma.sync: one product
    where fa2's widened 3xTF32 takes three; measured on the H200 only), else fa2. On the
    simulator fa2: there the tensor-core products are NumPy models, several times slower than
    fa2's FFMA loops."""
    if device == "sm_90":
        return ("wgmma16", "wgmma", "fa2")
    return ("fa2",) if device == "simulator" else ("mma16", "fa2")


def kernel_dtype(dtype):
    """The dtype the kernels run `dtype` inputs in: float32 for the half formats (float16,
    bfloat16: the API widens them on the device and rounds the results back), except for a
    pair with half_storage (runs_itself), else dtype itself."""
    return np.dtype(np.float32) if half_format(dtype) else np.dtype(dtype)


def runs_itself(pair, d, dtype, device):
    """True when `pair` itself (no fallback) runs head dim d on `dtype` inputs on `device`:
    its can_run asked with the kernels' dtype (float32 for half inputs), or with the half
    dtype itself for a pair with half_storage."""
    return pair.can_run(d, dtype if pair.half_storage else kernel_dtype(dtype), device)


def resolve(name, d, dtype, device=None):
    """The registered Pair that runs `name` ("auto" or a registered name) for head dim d and
    dtype on `device` (default: this process's), after fallbacks; half dtypes resolve as
    float32 (kernel_dtype) except for a pair with half_storage. ValueError for an unknown name or a case nothing can run;
    TypeError for a name that is not a string."""
    if not isinstance(name, str):
        raise TypeError(f"kernel must be a registered name (a str), got {name!r}")
    device = device or current_device()
    can_run = functools.partial(runs_itself, d=d, dtype=dtype, device=device)
    if name == "auto":
        for candidate in auto_order(device):
            if candidate in PAIRS and can_run(PAIRS[candidate]):
                return PAIRS[candidate]
        raise ValueError(f"no registered kernel runs d={d} {np.dtype(dtype)} on {device}")
    if name not in PAIRS:
        raise ValueError(f"unknown kernel {name!r}; registered: {sorted(PAIRS)} (or 'auto')")
    pair, tried = PAIRS[name], []
    while not can_run(pair):
        tried.append(pair.name)
        if pair.fallback is None or pair.fallback in tried:
            raise ValueError(f"kernel {name!r} cannot run d={d} {np.dtype(dtype)} on {device} "
                             f"(tried {tried})")
        pair = PAIRS[pair.fallback]
    return pair


def runs(name, d, dtype, device=None):
    """True when `name` resolves to a pair for (d, dtype) here (resolve without the error)."""
    try:
        resolve(name, d, dtype, device)
    except ValueError:
        return False
    return True


def tile_choices(name, kind, d, dtype, candidates, deterministic=False):
    """The (block_m, block_n) of `candidates` that the pair resolved for (d, dtype) accepts
    for `kind` ("forward" or "backward"): what the property tests draw from."""
    pair = resolve(name, d, dtype)
    # a half_storage forward takes the half dtype itself; every backward the kernels' dtype
    dt = dtype if pair.half_storage and kind == "forward" else kernel_dtype(dtype)
    return [t for t in candidates if pair.accepts(kind, *t, d, dt, deterministic)]


# --- the registered pairs ------------------------------------------------------------------

def _tiled_backward(*args, deterministic, **kw):
    """The tiled backward: dQ in its own kernel, no atomics (deterministic either way)."""
    backward.run_backward(*args, **kw)


def _check_tiled_backward(block_m, block_n, d, dtype, deterministic):
    backward.make_dkdv_kernel(block_m, block_n, d, False, dtype)
    backward.make_dq_kernel(block_m, block_n, d, False, dtype)


def _fa2_backward(*args, deterministic, **kw):
    """fa2's backward: dQ added by the dK/dV kernel with atomics (5 matmuls' work, not 7),
    or with deterministic=True by a dQ kernel of its own."""
    backward_fa2.run_backward(*args, dq_atomic=not deterministic, **kw)


def _fa2_backward_tiles(d, dtype, deterministic):
    return (backward_fa2.default_blocks(d, dtype) if deterministic
            else backward_fa2.default_blocks_atomic(d, dtype))


register(Pair(
    "rowwise", forward_rowwise.make_forward_kernel, _tiled_backward,
    forward_rowwise.default_blocks, lambda d, dtype, det: backward.default_blocks(d, dtype),
    _check_tiled_backward, replay=True,
    summary="one thread per query row (the readable forward), the tiled backward"))
register(Pair(
    "tiled", forward_tiled.make_forward_kernel, _tiled_backward,
    forward_tiled.default_blocks, lambda d, dtype, det: backward.default_blocks(d, dtype),
    _check_tiled_backward, replay=True,
    summary="thread tiles of S and O in shared memory; dK/dV and dQ kernels"))
register(Pair(
    "fa2", forward_fa2.make_forward_kernel, _fa2_backward,
    forward_fa2.default_blocks, _fa2_backward_tiles, backward_fa2.check_tiles, atomic_dq=True,
    exact_infinities=False, replay=True,
    summary="FlashAttention-2's work split; float32 backward products on mma.sync (3xTF32)"))
register(Pair(
    "wgmma", forward_wgmma.make_forward_kernel, backward_wgmma.run_backward,
    lambda d, dtype: forward_wgmma.tiles(d),
    lambda d, dtype, det: backward_wgmma.tiles(d),
    backward_wgmma.check_tiles, can_run=lambda d, dtype, device: (
        np.dtype(dtype) == np.float32 and 1 <= d <= 128 and device in ("sm_90", "simulator")),
    fallback="fa2", fixed_tiles=True, atomic_dq=True, exact_infinities=False, half_inputs=True,
    replay=True,
    summary="Hopper warpgroup products (wgmma), 3xTF32 (2 products a step for half inputs): "
            "float32, float16, bfloat16, d <= 128, sm_90"))
# the 16-bit Hopper forward: Q, K, V staged by TMA where the arrays allow it (1.48-1.69x the
# cp.async staging's forward, H100, 2026-12-05), else by cp.async, else element by element
_forward16_tma = functools.partial(forward16.make_forward_kernel, tma=True)


def _hopper16_pair(name, run_backward, summary):
    """A pair of the 16-bit Hopper forward (sm90.forward16, TMA staging) and `run_backward`,
    which takes the inputs as stored (half_storage): half dtypes, d <= 128, sm_90, else wgmma.
    Its backward tiles are wgmma's, for the widened backward
    (deterministic=True, or the "wgmma16-tf32bwd" pair); the 16-bit dK/dV kernel's blocks are
    fixed (128 keys x 64 queries) and it ignores them."""
    return Pair(
        name, _forward16_tma, run_backward,
        lambda d, dtype: forward16.tiles(d), lambda d, dtype, det: backward_wgmma.tiles(d),
        backward_wgmma.check_tiles, can_run=lambda d, dtype, device: (
            bool(half_format(dtype)) and 1 <= d <= 128 and device in ("sm_90", "simulator")),
        fallback="wgmma", fixed_tiles=True, atomic_dq=True, exact_infinities=False,
        half_inputs=True, half_storage=True, replay=True, summary=summary)


def shared_per_block(device):
    """Opt-in shared memory per block in bytes of `device` ("sm_XY"): the driver's figure
    for this process's GPU, else support.SHARED_PER_BLOCK's."""
    if not SIMULATOR and device == current_device():
        return dynamic_shared_limit()
    return SHARED_PER_BLOCK.get(device, SHARED_PER_BLOCK_LEAST)


def _mma16_can_run(d, dtype, device):
    """mma16: half dtypes, d <= 128, the simulator or an sm_80+ GPU whose shared memory per
    block holds both kernels' tiles for d's padded D (d = 128 needs 145 KiB: A100, H100 and
    later, not the 99 KiB of sm_86 / sm_89)."""
    if not (half_format(dtype) and 1 <= d <= 128):
        return False
    if device == "simulator":
        return True
    major = int(device[3:-1]) if device[3:].isdigit() and len(device) >= 5 else 0
    D = forward16.padded(d)
    need = max(forward16.shared_bytes(D), backward16.shared_bytes(D))
    return major >= 8 and need <= shared_per_block(device)


register(Pair(
    "mma16", functools.partial(forward16.make_forward_kernel, products="mma"),
    functools.partial(backward16.run_backward, products="mma"),
    lambda d, dtype: forward16.tiles(d),
    lambda d, dtype, det: backward16.widened_tiles(d, "mma", det),
    lambda bm, bn, d, dtype, det: backward16.check_widened_tiles(bm, bn, d, "mma", det),
    can_run=_mma16_can_run, fallback="fa2", fixed_tiles=True, atomic_dq=True,
    exact_infinities=False, half_inputs=True, half_storage=True, replay=True,
    summary="wgmma16's forward and backward on mma.sync.m16n8k16 (sm_80+: A100, L4, RTX "
            "30/40): float16 / bfloat16 as stored, d <= 128 (d <= 64 on 99 KiB GPUs)"))
register(_hopper16_pair(
    "wgmma16", backward16.run_backward,
    "Hopper wgmma on 16-bit products, forward and backward: float16 / bfloat16 read as "
    "stored, P and dS rounded to them (FlashAttention's rounding); d <= 128, sm_90"))
register(_hopper16_pair(
    "wgmma16-tf32bwd", backward16.run_widened,
    "wgmma16's forward, then wgmma's backward (3xTF32, 2 products a step) on the inputs "
    "widened to float32, S formed there from scale Q (the 16-bit backward's comparison)"))
