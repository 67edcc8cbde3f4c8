"""Public API: flash_attention_forward and flash_attention_backward.

Validation happens here, before any launch; inputs are never modified. A call whose arrays
and options match, in everything the checks read, one that passed them is not checked again
(the calls' memo, below); a call on torch tensors that matches two made before in
everything its work reads replays what the second did (numba_flash.replay).
"""

import math
from dataclasses import dataclass

import numpy as np

import reference as ref
from reference.precision import half_format

from . import arrays
from . import registry
from . import replay
from .kernels import convert
from .kernels.launch import recording
from .kernels.support import MAX_HEAD_DIM, ceil_div, head_grid, simulator_exclusive

DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class Shapes:
    """Validated sizes of one attention call: q viewed as (B*H, Nq, d), k/v as (B*Hk, Nk, d)."""
    lead: tuple          # leading dims of q, e.g. (B, H)
    kv_lead: tuple       # leading dims of k and v, e.g. (B, Hk)
    nq: int
    nk: int
    d: int
    dtype: np.dtype      # the inputs' (and outputs') dtype
    scale: float

    @property
    def half(self):
        """"float16" or "bfloat16" for half inputs, else None."""
        return half_format(self.dtype)

    @property
    def compute_dtype(self):
        """The dtype the kernels run in: float32 for half inputs (widened on the device,
        results rounded back once), else the inputs'."""
        return np.dtype(np.float32) if self.half else self.dtype

    @property
    def batch_heads(self):
        return math.prod(self.lead)

    @property
    def heads(self):
        """H: query heads per batch entry (the size of the axis GQA groups over)."""
        return self.lead[-1] if len(self.lead) == 2 else 1

    @property
    def group(self):
        """H / Hk: query heads that share one key head (1 without GQA)."""
        return math.prod(self.lead) // math.prod(self.kv_lead)


# Kernels index rows with 32-bit unsigned integers and form sums such as j + Nq and
# i + Nk: lengths stay below 2^31 so that no such sum wraps. Query heads (B*H) sit in grid
# y and z (support.head_grid), at most 65535 * 65535 of them; kept to a signed 32-bit count.
MAX_LENGTH = 2**31 - 1
MAX_BATCH_HEADS = 2**31 - 1


def as_array(name, x):
    """x if it is an array numba-flash takes as it is (NumPy, CuPy, a Numba device array, a
    torch tensor); any other array-like (a list, a tuple, an object with __array__) as
    np.asarray(x) makes it, so that lists of Python floats are float64; TypeError naming the
    argument when NumPy cannot make an array of it."""
    if arrays.kind_of(x) != "numpy" or isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be an array or array-like, got {type(x).__name__}: "
                        f"{e}") from None


def _scale(d, scale, dtype):
    """1/sqrt(d) or the given scale, as it will be in the kernels' dtype: a real number,
    finite and positive after conversion (1e39 is inf in float32, 1e-46 is 0)."""
    if scale is not None and (isinstance(scale, (bool, np.bool_, str, bytes))
                              or not np.isrealobj(scale) or np.ndim(scale) != 0):
        raise TypeError(f"scale must be a real number, got {scale!r}")
    try:
        scale = ref.default_scale(d, scale)   # 1/sqrt(d), or a finite positive scale
    except (TypeError, ValueError) as e:
        if isinstance(e, ValueError) and "finite and positive" in str(e):
            raise
        raise TypeError(f"scale must be a real number, got {scale!r}") from None
    with np.errstate(over="ignore", under="ignore"):
        converted = dtype.type(scale)
    if not (np.isfinite(converted) and converted > 0):
        raise ValueError(f"scale must be finite and positive in {dtype}: {scale!r} becomes "
                         f"{converted} there")
    return scale


def _validate(q, k, v, scale):
    named = (("q", q), ("k", k), ("v", v))
    dtypes = {}
    for name, x in named:
        dt = arrays.dtype_of(name, x)
        if dt.name not in DTYPES:
            raise TypeError(f"{name} must be one of {', '.join(DTYPES)}, got {dt}")
        if not dt.isnative:             # '>f4' is named float32 too, but the kernels read native
            raise TypeError(f"{name} must be in native byte order, got {dt.str} "
                            f"(x.astype(x.dtype.newbyteorder('=')) converts it)")
        dtypes[name] = dt
    if len(set(dtypes.values())) > 1:
        raise TypeError("q, k, v must share one dtype, got "
                        + ", ".join(f"{n}={dt}" for n, dt in dtypes.items()))
    shapes = {name: arrays.shape_of(x) for name, x in named}
    for name, shape in shapes.items():
        if len(shape) < 2:
            raise ValueError(f"{name} must have shape (..., N, d), got {shape}")
    (qs, ks, vs) = shapes["q"], shapes["k"], shapes["v"]
    if ks[:-2] != vs[:-2]:
        raise ValueError(f"k and v leading dims differ: k {ks}, v {vs}")
    if qs[:-2] != ks[:-2]:
        gqa = (len(qs) == 4 and len(ks) == 4 and qs[0] == ks[0] and ks[1] >= 1
               and qs[1] % ks[1] == 0)
        if not gqa:
            raise ValueError(
                f"q and k leading dims differ: q {qs}, k {ks}; they must match, except that for "
                f"4-D (B, H, N, d) inputs k and v may have Hk heads where Hk divides H")
    if ks[-2] != vs[-2]:
        raise ValueError(f"k and v lengths differ: k has {ks[-2]} rows, v has {vs[-2]}")
    if qs[-1] != ks[-1] or vs[-1] != qs[-1]:
        raise ValueError(f"head dims differ: q {qs[-1]}, k {ks[-1]}, v {vs[-1]}")
    d = qs[-1]
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head dim d={d} is not supported: it must be in 1..{MAX_HEAD_DIM}")
    if qs[-2] < 1 or ks[-2] < 1:
        raise ValueError(f"sequence lengths must be at least 1, got Nq={qs[-2]}, Nk={ks[-2]}")
    if math.prod(qs[:-2]) < 1:
        raise ValueError(f"q has an empty leading dim: {qs}")
    if max(qs[-2], ks[-2]) > MAX_LENGTH:
        raise ValueError(f"sequence lengths must be below 2^31, got Nq={qs[-2]}, Nk={ks[-2]} "
                         f"(the kernels index rows with 32-bit integers)")
    if math.prod(qs[:-2]) > MAX_BATCH_HEADS:
        raise ValueError(f"at most 2^31 - 1 query heads (the product of q's leading dims), got "
                         f"{math.prod(qs[:-2])}")
    devices = {name: arrays.device_of(x) for name, x in named}
    if len(set(devices.values())) > 1:
        raise ValueError("q, k, v are on different devices: "
                         + ", ".join(f"{n} on {dv}" for n, dv in devices.items()))
    for name, x in named:
        arrays.check_stored(name, x)
    # the scale multiplies the kernels' float32 products for half inputs
    scale = _scale(d, scale, np.dtype(np.float32) if half_format(dtypes["q"]) else dtypes["q"])
    return Shapes(qs[:-2], ks[:-2], qs[-2], ks[-2], d, dtypes["q"], scale)


def _widened(d_x, p, like, stream):
    """d_x (half) as a new float32 device array from like's pool, on `stream`; d_x itself
    when the inputs are not half."""
    if not p.half:
        return d_x
    wide = arrays.empty_device(d_x.shape, np.float32, like=like)
    convert.widen(d_x, wide, p.half, stream)
    return wide


def _kernel_input(x, shape, ptr, p, pair, like, stream):
    """Input x as `pair`'s kernels take it, a device array of `shape` for kernels on the stream
    of pointer ptr (arrays.to_device): for half inputs, its 16-bit patterns (a uint16 view)
    for a pair with half_storage, else widened to float32 (_widened); as it is otherwise."""
    if p.half and pair.half_storage:
        return arrays.to_device(x, shape, ptr, as_dtype=np.uint16)
    return _widened(arrays.to_device(x, shape, ptr), p, like, stream)


def _narrowed(d_x, p, like, stream):
    """float32 d_x rounded to the inputs' half dtype (a new array from like's pool, on
    `stream`); d_x itself when the inputs are not half."""
    if not p.half:
        return d_x
    narrow = arrays.empty_device(d_x.shape, p.dtype, like=like)
    convert.narrow(d_x, narrow, p.half, stream)
    return narrow


# The calls' memo. Every check above reads of an array only its class, dtype and shape (and,
# of a device array, its device and C-contiguity), and the registry answers from d, the dtype,
# the device and what is registered: so a call whose arrays and options match, in exactly
# those, one that passed its checks before passes them again and resolves to the same pair
# and tiles. Such a call skips them (`_recall`): under cProfile, _validate and
# registry.resolve were about a quarter of a forward's host time on the H200's host
# (tools/call_time.py --profile, 2026-12-04). NumPy and CuPy arrays and torch tensors are
# keyed; other kinds (Numba's device arrays, array-likes) are checked at every call.
MEMO_ENTRIES = 1024
_memo = {}


def _array_key(x):
    """What the checks read of x, hashable: class, dtype and shape of a NumPy array; of a
    torch tensor also whether it is on a CUDA device, which one, whether it is C-contiguous
    and whether its negative bit is set; of a CuPy array its device and C-contiguity; None
    for other kinds."""
    t = type(x)
    if t is np.ndarray:
        return t, x.dtype, x.shape
    kind = arrays.kind_of(x)
    if kind == "torch":
        return t, x.dtype, x.shape, x.is_cuda, x.get_device(), x.is_contiguous(), x.is_neg()
    if kind == "cupy":
        return t, x.dtype, x.shape, x.device.id, x.flags.c_contiguous
    return None


_KEYED_OPTIONS = (type(None), bool, int, float, str, np.integer, np.floating, np.bool_)


def _memo_key(xs, options):
    """The memo's key of a call on arrays xs (q first) with `options` (values and their
    types: 1 and True are not one scale): None when an array is of a kind not keyed or an
    option is not an immutable scalar (a 0-d tensor as scale is hashed by its identity, and
    its value can change in place: checked at every call). NumPy inputs run on the current
    device, which the key names; a tensor's key names its own (the kernels run on Numba's
    current device, which for a tensor elsewhere fails at launch with or without the memo).
    The registry's generation ends a key when register or unregister changes what a name
    resolves to."""
    if not all(isinstance(o, _KEYED_OPTIONS) or isinstance(o, type) for o in options):
        return None
    keys = tuple(map(_array_key, xs))
    if None in keys:
        return None
    device = registry.current_device() if type(xs[0]) is np.ndarray else None
    key = (keys, options, device, registry.generation())
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _recall(key):
    """The (Shapes, pair, block_m, block_n) remembered for key, or None."""
    if key is None:
        return None
    setup = _memo.get(key)
    if setup is None or registry.PAIRS.get(setup[1].name) is not setup[1]:
        return None
    return setup


def _remember(key, setup):
    """Remember a call's setup once its checks have passed (key None: nothing)."""
    if key is None:
        return
    if len(_memo) >= MEMO_ENTRIES:       # a process that met many shapes
        _memo.clear()
    _memo[key] = setup


def _blocks(defaults, block_m, block_n):
    return (defaults[0] if block_m is None else block_m), (defaults[1] if block_n is None else block_n)


def _flag(name, value):
    """A bool flag: Python or NumPy bool only (a string such as "no" would be truthy)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def flash_attention_forward(q, k, v, *, causal=False, scale=None, block_m=None, block_n=None,
                            kernel="auto"):
    """FlashAttention forward on the GPU.

    q (..., Nq, d), k and v (..., Nk, d) with the same leading dims; for 4-D (B, H, N, d)
    inputs k and v may have Hk heads, Hk dividing H (grouped-query attention). float32 or
    float64, computed in that precision, or float16 / bfloat16: read as stored by the 16-bit
    Hopper pairs (products in the format, sums in float32), else widened to float32 on the
    device; out comes back in the inputs' dtype; d in 1..256.
    causal masks key j for query i when j > i + (Nk - Nq) (bottom-right aligned).
    Array-likes that are none of NumPy, CuPy, Numba or torch arrays (lists, tuples) are taken
    as np.asarray takes them (lists of Python floats are float64).
    scale defaults to 1/sqrt(d); it must be finite and positive in the kernels' dtype (the
    inputs', float32 for half inputs).
    kernel: "auto" (the fastest registered pair that can run this case here: on sm_90 with
    d <= 128 the Hopper pairs, "wgmma" in float32 and "wgmma16" for float16 / bfloat16; on
    other sm_80+ GPUs "mma16" for float16 / bfloat16 where its shared memory fits; else
    "fa2")
    or a registered name (numba_flash.registry.PAIRS; a pair that cannot run the case falls
    back as the registry says). block_m / block_n override the pair's tile sizes (ValueError
    for tiles it cannot take). Pass the same kernel to flash_attention_backward.

    Returns out (..., Nq, d) like q and lse (..., Nq) (natural log, float64 for float64
    inputs, else float32), as the same kind of array as q. Rows that see no key
    (Nq > Nk under causal) give out = 0, lse = -inf.

    On torch tensors, a call that matches two earlier ones in its tensors' shapes, dtypes,
    layout and alignment, its options and the current stream replays what the second launched
    and allocated on its own tensors, its checks skipped (numba_flash.replay; the backward
    too).
    """
    causal = _flag("causal", causal)
    options = ("forward", causal, type(scale), scale, type(block_m), block_m, type(block_n),
               block_n, type(kernel), kernel)
    plan_key = replay.key((q, k, v), options)   # torch tensors: what a call like it did
    if plan_key is not None:
        replayed = replay.run(plan_key, (q, k, v))
        if replayed is not None:
            return replayed
    q, k, v = as_array("q", q), as_array("k", k), as_array("v", v)
    key = _memo_key((q, k, v), options)
    setup = _recall(key)
    if setup is None:
        p = _validate(q, k, v, scale)
        pair = registry.resolve(kernel, p.d, p.dtype)
        bm, bn = _blocks(pair.forward_tiles(p.d, p.compute_dtype), block_m, block_n)
    else:
        p, pair, bm, bn = setup
    dt = p.compute_dtype
    # a pair with half_inputs compiles kernels that know the widened values are half; one
    # with half_storage kernels that read and write them as stored (16-bit patterns)
    launch, threads = pair.make_forward(bm, bn, p.d, causal,
                                        p.dtype if p.half and pair.half_inputs else dt)
    _remember(key, (p, pair, bm, bn))       # (the factory has taken the tiles)
    stored = bool(p.half and pair.half_storage)
    bh, bhk = p.batch_heads, math.prod(p.kv_lead)
    ptr, stream = arrays.launch_stream(q)
    grid = (ceil_div(p.nq, bm), *head_grid(bh))
    # (a call whose key came back is recorded, to make its plan: the list holds its
    # allocations to the end)
    with simulator_exclusive(), recording(replay.repeated(plan_key)) as events:
        d_out = (arrays.empty_device((bh, p.nq, p.d), p.dtype, like=q, as_dtype=np.uint16)
                 if stored else arrays.empty_device((bh, p.nq, p.d), dt, like=q))
        d_lse = arrays.empty_device((bh, p.nq), dt, like=q)
        d_q, d_k, d_v = (_kernel_input(x, shape, ptr, p, pair, q, stream)
                         for x, shape in ((q, (bh, p.nq, p.d)), (k, (bhk, p.nk, p.d)),
                                          (v, (bhk, p.nk, p.d))))
        launch[grid, threads, stream](d_q, d_k, d_v, d_out, d_lse, dt.type(p.scale), p.heads,
                                      p.group)
        if not stored:
            d_out = _narrowed(d_out, p, q, stream)
    results = (arrays.from_device(d_out, p.lead + (p.nq, p.d), q),
               arrays.from_device(d_lse, p.lead + (p.nq,), q))
    replay.remember(plan_key, pair, events, (q, k, v), results)
    return results


def _check_like(name, x, shape, p, device, dtype=None):
    """x must be an array of the given shape, of `dtype` (default p's), on the given device."""
    dt, want = arrays.dtype_of(name, x), dtype or p.dtype
    if dt != want:
        raise TypeError(f"{name} must have dtype {want} (what the forward gives for {p.dtype} "
                        f"q), got {dt}")
    if arrays.shape_of(x) != shape:
        raise ValueError(f"{name} must have shape {shape} (what the forward pass gives), "
                         f"got {arrays.shape_of(x)}")
    if arrays.device_of(x) != device:
        raise ValueError(f"{name} is on {arrays.device_of(x)}, q on {device}")
    arrays.check_stored(name, x)


def _backward_setup(dout, q, k, v, out, lse, scale, deterministic, block_m, block_n, kernel):
    """The backward's checks (before any launch) and its pair: (Shapes, pair, block_m,
    block_n)."""
    p = _validate(q, k, v, scale)
    device = arrays.device_of(q)
    _check_like("dout", dout, p.lead + (p.nq, p.d), p, device)
    _check_like("out", out, p.lead + (p.nq, p.d), p, device)
    dt = p.compute_dtype
    _check_like("lse", lse, p.lead + (p.nq,), p, device, dtype=dt)
    pair = registry.resolve(kernel, p.d, p.dtype)
    bm, bn = _blocks(pair.backward_tiles(p.d, dt, deterministic), block_m, block_n)
    if (block_m, block_n) != (None, None):         # the factories' errors
        if pair.check_backward_tiles is not None:
            pair.check_backward_tiles(bm, bn, p.d, dt, deterministic)
        elif (bm, bn) != pair.backward_tiles(p.d, dt, deterministic):
            raise ValueError(f"the {pair.name!r} backward has tiles "
                             f"{pair.backward_tiles(p.d, dt, deterministic)} only here, "
                             f"got block_m={bm}, block_n={bn}")
    return p, pair, bm, bn


def flash_attention_backward(dout, q, k, v, out, lse, *, causal=False, scale=None,
                             deterministic=False, block_m=None, block_n=None,
                             kernel="auto"):
    """FlashAttention backward on the GPU, from the forward's out and lse (no P saved).

    dout and out (..., Nq, d) like q; lse (..., Nq) as flash_attention_forward returns it
    (float32 for half inputs, which the 16-bit Hopper pairs read as stored and others widen
    to float32 here as in the forward, dq, dk, dv rounded back once: 4 bytes an element of
    dout, q, k, v, out, dq, dk, dv extra);
    q, k, v, causal and scale as in flash_attention_forward (pass the same ones).
    Returns dq, dk, dv with q, k, v's shapes, as the same kind of array as q. Under GQA dk
    and dv sum over the query heads that share a key head. Rows that saw no key give zero
    gradients. Besides its outputs it allocates only D = rowsum(dO * O), (..., Nq).

    kernel: as in flash_attention_forward (the same name resolves to the same pair, whose
    backward recomputes S as its forward formed it).
    deterministic: True asks for bitwise reproducible results: pairs whose dq is added with
    atomics (registry.Pair.atomic_dq: "fa2", "wgmma") then run their dQ pass without atomics
    ("fa2": its dQ kernel, with its own default tiles; "wgmma": the Hopper dQ pass, which
    recomputes S with the forward's code); "tiled" and "rowwise" use no atomics either way.
    """
    causal = _flag("causal", causal)
    deterministic = _flag("deterministic", deterministic)
    options = ("backward", causal, deterministic, type(scale), scale, type(block_m), block_m,
               type(block_n), block_n, type(kernel), kernel)
    plan_key = replay.key((q, k, v, dout, out, lse), options)
    if plan_key is not None:
        replayed = replay.run(plan_key, (q, k, v, dout, out, lse))
        if replayed is not None:
            return replayed
    q, k, v = as_array("q", q), as_array("k", k), as_array("v", v)
    dout, out, lse = as_array("dout", dout), as_array("out", out), as_array("lse", lse)
    key = _memo_key((q, k, v, dout, out, lse), options)
    setup = _recall(key)
    if setup is None:
        setup = _backward_setup(dout, q, k, v, out, lse, scale, deterministic, block_m,
                                block_n, kernel)
        _remember(key, setup)
    p, pair, bm, bn = setup
    dt = p.compute_dtype
    bh, bhk = p.batch_heads, math.prod(p.kv_lead)
    qs, ks = (bh, p.nq, p.d), (bhk, p.nk, p.d)
    # a half_storage pair takes the half inputs as stored (16-bit patterns) and their format,
    # and writes dk, dv so; dq is float32 for every pair (added by atomics)
    stored = bool(p.half and pair.half_storage)
    ptr, stream = arrays.launch_stream(q)
    extra = {"fmt": p.half} if stored else {"half": True} if p.half and pair.half_inputs else {}
    # (workspace from q's pool too)
    with arrays.allocating_like(q), simulator_exclusive(), \
            recording(replay.repeated(plan_key)) as events:
        d_dq = arrays.empty_device(qs, dt, like=q)
        d_dk, d_dv = ((arrays.empty_device(ks, p.dtype, like=q, as_dtype=np.uint16)
                       for _ in range(2)) if stored else
                      (arrays.empty_device(ks, dt, like=q) for _ in range(2)))
        d_dout, d_q, d_k, d_v, d_out = (
            _kernel_input(x, shape, ptr, p, pair, q, stream)
            for x, shape in ((dout, qs), (q, qs), (k, ks), (v, ks), (out, qs)))
        pair.run_backward(d_dout, d_q, d_k, d_v, arrays.to_device(lse, (bh, p.nq), ptr), d_out,
                          d_dq, d_dk, d_dv, scale=p.scale,
                          heads=p.heads, group=p.group, causal=causal, block_m=bm,
                          block_n=bn, deterministic=deterministic, stream=stream, **extra)
        d_dq = _narrowed(d_dq, p, q, stream)
        if not stored:
            d_dk, d_dv = (_narrowed(g, p, q, stream) for g in (d_dk, d_dv))
    results = (arrays.from_device(d_dq, arrays.shape_of(q), q),
               arrays.from_device(d_dk, arrays.shape_of(k), q),
               arrays.from_device(d_dv, arrays.shape_of(v), q))
    replay.remember(plan_key, pair, events, (q, k, v, dout, out, lse), results)
    return results
