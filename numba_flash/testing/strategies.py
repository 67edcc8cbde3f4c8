"""Hypothesis strategies for attention problems and logit regimes.

`problems(size=...)` draws a Problem: shapes (batch, heads with GQA ratios, Nq, Nk including 1
and sizes just off a tile multiple, d), causal, dtype, tile sizes, and a logit regime; its
`inputs()` builds q, k, v, dout deterministically from the drawn seed. Sizes come from
SIZES[size]: "simulator" stays tiny (the CUDA simulator runs one OS thread per CUDA thread),
"gpu" reaches real sizes.
"""

import math
from dataclasses import asdict, dataclass, field

import numpy as np
from hypothesis import strategies as st

from ..api import DTYPES      # the dtypes the API takes, drawn by default

SIZES = {
    "simulator": dict(max_n=40, max_d=16, max_batch=2, max_heads=2),
    "gpu": dict(max_n=1100, max_d=256, max_batch=2, max_heads=4),
    # the Hopper family's two-warpgroup kernels (64 < d <= 128) on the simulator
    # (from 2 keys and queries: with one key dS is 0, and a backward's dQ or dK shows nothing)
    "simulator-wide": dict(min_d=65, min_n=2, max_n=24, max_d=80, max_batch=1, max_heads=1),
    # several K/V blocks of the Hopper family's 64 keys (the online softmax's rescaling)
    # (two blocks are enough: 65-80 keys, d <= 8, to keep the simulated 128 threads cheap)
    "simulator-blocks": dict(min_n=65, max_n=80, max_d=8, max_batch=1, max_heads=1),
    # grouped-query attention only (2 or 4 query heads a key head): what a backward does per
    # key head across its query heads
    "simulator-gqa": dict(max_n=16, max_d=16, max_batch=1, max_heads=2, min_group=2),
}

REGIMES = ("ordinary", "huge", "dominant key", "all equal", "row offsets", "near-cancelling",
           "fully masked rows", "large v", "large dO", "tiny dO", "rising keys")


# (block_m, block_n) candidates: a property draws from those the kernel pair under test accepts
# for the drawn d and dtype (registry.tile_choices, asking the pair's own factories), so a
# user's variant gets the tiles it takes; small ones first, the simulator being slow
TILE_CANDIDATES = ((4, 4), (8, 8), (8, 16), (16, 8), (16, 16), (16, 32), (32, 16), (32, 32),
                   (64, 4), (64, 8), (64, 16), (16, 64), (64, 32), (32, 64))


def valid_tiles(kernel, kind, d, dtype):
    """The TILE_CANDIDATES that registered pair `kernel` accepts for `kind` ("forward" or
    "backward") at head dim d and dtype (its default tiles if it accepts none of them)."""
    from .. import registry
    found = registry.tile_choices(kernel, kind, d, dtype, TILE_CANDIDATES)
    if found:
        return found
    pair = registry.resolve(kernel, d, dtype)
    return [pair.forward_tiles(d, registry.kernel_dtype(dtype)) if kind == "forward"
            else pair.backward_tiles(d, registry.kernel_dtype(dtype), False)]


@dataclass(frozen=True)
class Problem:
    """One drawn attention problem: q (B, H, Nq, d), k and v (B, Hk, Nk, d)."""
    B: int
    H: int
    Hk: int
    Nq: int
    Nk: int
    d: int
    causal: bool
    dtype: str
    regime: str
    seed: int
    block_m: int = None
    block_n: int = None
    saved: tuple = field(default=None, compare=False, repr=False)   # replayed (q, k, v, dout)

    def describe(self):
        gqa = f"/{self.Hk}" if self.Hk != self.H else ""
        tiles = f" tiles {self.block_m}x{self.block_n}" if self.block_m else ""
        return (f"B{self.B} H{self.H}{gqa} Nq{self.Nq} Nk{self.Nk} d{self.d} {self.dtype}"
                f"{' causal' if self.causal else ''} [{self.regime}] seed {self.seed}{tiles}")

    def as_dict(self):
        d = asdict(self)
        d.pop("saved")
        return d

    def inputs(self):
        """(q, k, v, dout) as NumPy arrays of self.dtype, shaped by the regime (or the arrays
        a reproducer file saved)."""
        if self.saved is not None:
            return tuple(a.copy() for a in self.saved)
        return logits_regime(self.regime, self.B, self.H, self.Hk, self.Nq, self.Nk, self.d,
                             np.dtype(self.dtype), self.seed)


def logits_regime(regime, B, H, Hk, nq, nk, d, dtype, seed):
    """Inputs whose logits S = q k^T / sqrt(d) follow `regime`:

    ordinary          q, k, v ~ N(0, 1): |S| of order 1.
    huge              |S| ~ 1e4 in float32, ~1e5 in the half formats (past float16's largest,
                      65504: harmless only if S is never held in float16) and ~1e6 in
                      float64: exp(S) overflows many times over.
    dominant key      one key per head has a logit ~ 40 above every other for every query.
    all equal         every key row identical: all logits of a row equal, P uniform.
    row offsets       each query row's logits shifted by its own constant of up to 1e3.
    near-cancelling   q.k sums terms of +-1e3 that cancel, leaving O(1) logits.
    fully masked rows causal with Nq > Nk makes the first Nq - Nk rows see no key (forced by
                      the strategy; here the data are ordinary).
    large v           |v| from 2e4 to 6e4, near float16's largest, one sign per column: out
                      there too; the unnormalized O (l >= 1 times it) overflows float16 (a
                      rescale or P V held in float16 gives inf).
    large dO          dO ~ 2e3 with nearly equal keys: the terms of dq = scale dS K reach
                      ~1e5 and cancel (rows of dS sum to zero), so dS K summed in float16
                      overflows while the true dq is small.
    tiny dO           dO ~ 1e-6: the gradients fall to float16's subnormals (below 6.1e-5).
    rising keys       every row's logits rise by 12 from each key to the next (every row's
                      max is its last visible key): each K/V block moves the running max m
                      past the last block's by e^12 in P and beyond FlashAttention-3's lazy
                      threshold (2^8), so a rescale of l or O left out, or done late, errs
                      by a factor, not a rounding.
    """
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, nq, d))
    k = rng.standard_normal((B, Hk, nk, d))
    v = rng.standard_normal((B, Hk, nk, d))
    dout = rng.standard_normal((B, H, nq, d))
    root = math.sqrt(math.sqrt(d))                  # (a q).(b u) / sqrt(d) = a b / root^2
    if regime == "huge":                            # q, k scaled by a: S scaled by a^2
        a = math.sqrt({"float32": 1e4, "float64": 1e6}.get(np.dtype(dtype).name, 1e5))
        q *= a
        k *= a
    elif regime == "dominant key":
        u = np.ones(d) / math.sqrt(d)
        q = 0.1 * q + 8 * root * u
        j = rng.integers(nk)
        k[..., j, :] += 5 * root * u
    elif regime == "all equal":
        k[...] = k[..., :1, :]
    elif regime == "row offsets":
        q[..., 0] = rng.uniform(-1e3, 1e3, size=q.shape[:-1])
        k[..., 0] = 1.0
    elif regime == "near-cancelling" and d >= 2:
        q[..., 0] = q[..., 1] = 30.0
        k[..., 0], k[..., 1] = 30.0 * np.ones_like(k[..., 0]), -30.0 * np.ones_like(k[..., 1])
    elif regime == "large v":
        # |v| near float16's largest, one sign per column: O = sum_j P_ij v_j / l_i stays in
        # range, but the unnormalized sum (l_i >= 1 times it) does not, in a kernel that
        # holds it in float16
        sign = np.where(rng.standard_normal(d) < 0, -1.0, 1.0)
        v = np.clip(np.abs(v) * 3e4 + 2e4, 0, 6e4) * sign
    elif regime == "large dO":
        dout *= 2e3
        k = k[..., :1, :] + 0.01 * k
    elif regime == "tiny dO":
        dout *= 1e-6
    elif regime == "rising keys":
        # S_ij = q_i0 k_j0 / sqrt(d) + the rest: 12 j from q_i0 = root, k_j0 = 12 j root, the
        # other d - 1 terms (N(0, 1) each, scaled to sum to |.| < 1 mostly) cannot reorder keys
        q[..., 1:] *= 0.3 / root
        k[..., 1:] *= 0.3 / root
        q[..., 0] = root
        k[..., 0] = 12.0 * root * np.arange(nk)
    return tuple(a.astype(dtype) for a in (q, k, v, dout))


def sequence_lengths(max_n, min_n=1):
    """1, sizes just off a tile multiple (15, 17, 31, 33, 63, 65, ...), and anything else
    (from min_n up)."""
    near = sorted({n + o for n in (16, 32, 64, 128, 256, 512, 1024) for o in (-1, 0, 1)
                   if min_n <= n + o <= max_n})
    return st.one_of(*([st.just(1)] if min_n <= 1 else []), st.sampled_from(near),
                     st.integers(min_n, max_n))


@st.composite
def problems(draw, size="simulator", dtypes=DTYPES, regimes=REGIMES,
             tiles=None):
    """A Problem. tiles: None (kernel defaults) or (kernel, kind): draw a tile size that
    registered pair `kernel` accepts for `kind` ("forward" / "backward") at the drawn d and
    dtype (valid_tiles)."""
    lim = SIZES[size]
    regime = draw(st.sampled_from(regimes))
    B = draw(st.integers(1, lim["max_batch"]))
    Hk = draw(st.integers(1, max(1, lim["max_heads"] // 2)))
    H = Hk * draw(st.sampled_from([g for g in (1, 2, 4) if g >= lim.get("min_group", 1)]))
    min_d = lim.get("min_d", 1)
    d = draw(st.one_of(st.integers(min_d, lim["max_d"]), st.sampled_from(
        [x for x in (1, 16, 59, 64, 72, 111, 128, 256) if min_d <= x <= lim["max_d"]])))
    nq = draw(sequence_lengths(lim["max_n"], lim.get("min_n", 1)))
    nk = draw(sequence_lengths(lim["max_n"], lim.get("min_n", 1)))
    causal = draw(st.booleans())
    if regime == "fully masked rows":
        causal = True
        if nq <= nk:
            nq, nk = nk + 1, nq
            nq = min(nq, lim["max_n"] + 1)
            nk = min(nk, nq - 1)
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    block_m = block_n = None
    if tiles:
        block_m, block_n = draw(st.sampled_from(valid_tiles(*tiles, d, dtype)))
    return Problem(B, H, Hk, nq, nk, d, causal, dtype, regime, seed, block_m, block_n)
