"""Public API: flash_attention_forward and flash_attention_backward.

Validation happens here, before any launch; inputs are never modified.
"""

import math
from dataclasses import dataclass

import numpy as np

import reference as ref

from . import arrays
from .kernels import BACKWARD, DEFAULT_BACKWARD, DEFAULT_FORWARD, FORWARD
from .kernels.common import MAX_HEAD_DIM, ceil_div


@dataclass(frozen=True)
class Shapes:
    """Validated sizes of one attention call: q viewed as (B*H, Nq, d), k/v as (B*Hk, Nk, d)."""
    lead: tuple          # leading dims of q, e.g. (B, H)
    kv_lead: tuple       # leading dims of k and v, e.g. (B, Hk)
    nq: int
    nk: int
    d: int
    dtype: np.dtype
    scale: float

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


def _validate(q, k, v, scale):
    named = (("q", q), ("k", k), ("v", v))
    dtypes = {}
    for name, x in named:
        dt = arrays.dtype_of(name, x)
        if dt.kind != "f":
            raise TypeError(f"{name} must be float32 or float64, got {dt}")
        if dt not in (np.float32, np.float64):
            raise TypeError(f"{name}: {dt} is not supported (float32 and float64 are)")
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
    devices = {name: arrays.device_of(x) for name, x in named}
    if len(set(devices.values())) > 1:
        raise ValueError("q, k, v are on different devices: "
                         + ", ".join(f"{n} on {dv}" for n, dv in devices.items()))
    for name, x in named:
        if arrays.kind_of(x) != "numpy" and not arrays.is_c_contiguous(x):
            raise ValueError(f"{name} is a non-contiguous device array; pass a contiguous copy "
                             f"(e.g. .contiguous() in torch, cupy.ascontiguousarray)")
    try:
        scale = ref.default_scale(d, scale)   # 1/sqrt(d), or a finite positive scale
    except TypeError:
        raise TypeError(f"scale must be a real number, got {scale!r}") from None
    return Shapes(qs[:-2], ks[:-2], qs[-2], ks[-2], d, dtypes["q"], scale)


def _blocks(variant, p, block_m, block_n):
    dm, dn = variant.default_blocks(p.d, p.dtype)
    return (dm if block_m is None else block_m), (dn if block_n is None else block_n)


def _variant(table, kernel):
    if kernel not in table:
        raise ValueError(f"unknown kernel {kernel!r}; registered: {sorted(table)}")
    return table[kernel]


def flash_attention_forward(q, k, v, *, causal=False, scale=None, block_m=None, block_n=None,
                            kernel=DEFAULT_FORWARD):
    """FlashAttention forward on the GPU.

    q (..., Nq, d), k and v (..., Nk, d) with the same leading dims; for 4-D (B, H, N, d)
    inputs k and v may have Hk heads, Hk dividing H (grouped-query attention). float32 or
    float64, computed in that precision; d in 1..256.
    causal masks key j for query i when j > i + (Nk - Nq) (bottom-right aligned).
    scale defaults to 1/sqrt(d). block_m / block_n override the variant's tile sizes;
    kernel names a registered variant (numba_flash.kernels.FORWARD).

    Returns out (..., Nq, d) like q and lse (..., Nq) (natural log, float32 for float32
    inputs, float64 for float64), as the same kind of array as q. Rows that see no key
    (Nq > Nk under causal) give out = 0, lse = -inf.
    """
    p = _validate(q, k, v, scale)
    variant = _variant(FORWARD, kernel)
    bm, bn = _blocks(variant, p, block_m, block_n)
    launch, threads = variant.make_kernel(bm, bn, p.d, bool(causal), p.dtype)
    bh, bhk = p.batch_heads, math.prod(p.kv_lead)
    d_q = arrays.to_device(q, (bh, p.nq, p.d))
    d_k = arrays.to_device(k, (bhk, p.nk, p.d))
    d_v = arrays.to_device(v, (bhk, p.nk, p.d))
    d_out = arrays.empty_device((bh, p.nq, p.d), p.dtype, like=q)
    d_lse = arrays.empty_device((bh, p.nq), p.dtype, like=q)
    grid = (ceil_div(p.nq, bm), bh)
    launch[grid, threads](d_q, d_k, d_v, d_out, d_lse, p.dtype.type(p.scale), p.heads, p.group)
    return (arrays.from_device(d_out, p.lead + (p.nq, p.d), q),
            arrays.from_device(d_lse, p.lead + (p.nq,), q))


def _check_like(name, x, shape, p, device):
    """x must be an array of the given shape, of p's dtype, on the given device."""
    dt = arrays.dtype_of(name, x)
    if dt != p.dtype:
        raise TypeError(f"{name} must have dtype {p.dtype} like q, got {dt}")
    if arrays.shape_of(x) != shape:
        raise ValueError(f"{name} must have shape {shape} (what the forward pass gives), "
                         f"got {arrays.shape_of(x)}")
    if arrays.device_of(x) != device:
        raise ValueError(f"{name} is on {arrays.device_of(x)}, q on {device}")
    if arrays.kind_of(x) != "numpy" and not arrays.is_c_contiguous(x):
        raise ValueError(f"{name} is a non-contiguous device array; pass a contiguous copy")


def flash_attention_backward(dout, q, k, v, out, lse, *, causal=False, scale=None,
                             deterministic=False, block_m=None, block_n=None,
                             kernel=DEFAULT_BACKWARD):
    """FlashAttention backward on the GPU, from the forward's out and lse (no P saved).

    dout and out (..., Nq, d) like q; lse (..., Nq) as flash_attention_forward returns it;
    q, k, v, causal and scale as in flash_attention_forward (pass the same ones).
    Returns dq, dk, dv with q, k, v's shapes, as the same kind of array as q. Under GQA dk
    and dv sum over the query heads that share a key head. Rows that saw no key give zero
    gradients. Besides its outputs it allocates only D = rowsum(dO * O), (..., Nq).

    deterministic: True asks for bitwise reproducible results. The "tiled" and "fa2"
    kernels use no atomics (dQ has its own kernel), so they are reproducible either way; the
    default, "fa2-atomic", adds dQ up with atomics (its dq may differ in the last bits from
    call to call), and with deterministic=True the "fa2" kernel runs instead, with fa2's
    default tiles unless block_m / block_n are given; so does "fa2-ffma" (fa2-atomic with
    every product an FFMA sum, where the default puts the accumulating ones on tensor cores
    in float32).
    """
    p = _validate(q, k, v, scale)
    device = arrays.device_of(q)
    _check_like("dout", dout, p.lead + (p.nq, p.d), p, device)
    _check_like("out", out, p.lead + (p.nq, p.d), p, device)
    _check_like("lse", lse, p.lead + (p.nq,), p, device)
    variant = _variant(BACKWARD, kernel)
    if deterministic and variant.when_deterministic:
        variant = BACKWARD[variant.when_deterministic]
    bm, bn = _blocks(variant, p, block_m, block_n)
    bh, bhk = p.batch_heads, math.prod(p.kv_lead)
    qs, ks = (bh, p.nq, p.d), (bhk, p.nk, p.d)
    d_dq = arrays.empty_device(qs, p.dtype, like=q)
    d_dk = arrays.empty_device(ks, p.dtype, like=q)
    d_dv = arrays.empty_device(ks, p.dtype, like=q)
    with arrays.allocating_like(q):                 # its workspace from q's pool too
        variant.run(arrays.to_device(dout, qs), arrays.to_device(q, qs),
                    arrays.to_device(k, ks), arrays.to_device(v, ks),
                    arrays.to_device(lse, (bh, p.nq)), arrays.to_device(out, qs), d_dq, d_dk,
                    d_dv, scale=p.scale, heads=p.heads, group=p.group, causal=bool(causal),
                    block_m=bm, block_n=bn)
    return (arrays.from_device(d_dq, arrays.shape_of(q), q),
            arrays.from_device(d_dk, arrays.shape_of(k), q),
            arrays.from_device(d_dv, arrays.shape_of(v), q))
