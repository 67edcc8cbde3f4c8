"""Named attention problems and their inputs, shared by `numba-flash verify` and the tests."""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Case:
    """One problem: q (B, H, Nq, d), k and v (B, Hk, Nk, d); q and k are multiplied by
    logit_scale (so logits grow by its square: 1e3 gives |S| of order 1e6)."""
    name: str
    B: int
    H: int
    Hk: int
    Nq: int
    Nk: int
    d: int
    causal: bool = False
    logit_scale: float = 1.0

    def __str__(self):
        s = f"B{self.B} H{self.H}"
        s += f"/{self.Hk}" if self.Hk != self.H else ""
        s += f" Nq{self.Nq} Nk{self.Nk} d{self.d}{' causal' if self.causal else ''}"
        return s + (f" x{self.logit_scale:g}" if self.logit_scale != 1 else "")

    def inputs(self, dtype, seed=0):
        """(q, k, v, dout) as NumPy arrays of dtype, drawn from N(0, 1)."""
        rng = np.random.default_rng(seed)
        q = rng.standard_normal((self.B, self.H, self.Nq, self.d)) * self.logit_scale
        k = rng.standard_normal((self.B, self.Hk, self.Nk, self.d)) * self.logit_scale
        v = rng.standard_normal((self.B, self.Hk, self.Nk, self.d))
        dout = rng.standard_normal((self.B, self.H, self.Nq, self.d))
        return tuple(a.astype(dtype) for a in (q, k, v, dout))


# What every case list covers (tests/test_verify_cli.py checks both): odd sizes, Nq != Nk,
# causal (Nq < Nk too), GQA, logits x1e3, fully masked rows (causal with Nq > Nk), d not a
# multiple of 8. `numba-flash verify` runs every case in both dtypes, so a case's cost counts
# twice or more; the sizes are what its time budgets allow (README).

# Simulator sizes: N <= 64, d <= 32 (one OS thread per CUDA thread; a float32 fa2 backward
# costs some 4 s per (batch, head) there).
SIMULATOR_CASES = (
    Case("odd sizes", 1, 2, 2, 19, 19, 7),
    Case("Nq != Nk", 1, 1, 1, 13, 29, 16),
    Case("causal", 1, 2, 2, 23, 23, 9, causal=True),
    Case("causal, Nq < Nk", 1, 1, 1, 9, 25, 8, causal=True),
    Case("GQA", 2, 2, 1, 11, 17, 8, causal=True),
    Case("logits x1e3", 1, 1, 1, 17, 17, 8, logit_scale=1e3),
    Case("fully masked rows", 1, 1, 1, 21, 7, 5, causal=True),
    Case("Nq = 1", 1, 1, 1, 1, 33, 32),
)

# GPU sizes: partial tiles everywhere (flash-attention's test sizes), d from 1 to 256, most
# spanning several tiles. On a GPU verify's time goes mostly to compiling, and the kernels
# compile per (d, causal, dtype): the cases share 6 (d, causal) pairs among them. B*H*Nq*Nk*d
# stays below 3e7 a case: the float64 kernels' truth is long double, computed on the CPU
# without BLAS (5 s for all of these, forward and backward, on a 2-core CPU).
GPU_CASES = (
    Case("odd sizes", 2, 3, 3, 97, 97, 111),
    Case("Nq != Nk", 1, 1, 1, 383, 513, 111),
    Case("causal", 1, 1, 1, 512, 512, 59, causal=True),
    Case("causal, Nq < Nk", 1, 1, 1, 200, 450, 128, causal=True),
    Case("GQA", 2, 6, 2, 130, 257, 59, causal=True),
    Case("MQA, d = 256", 1, 4, 1, 130, 200, 256),
    Case("logits x1e3", 1, 2, 2, 256, 256, 64, logit_scale=1e3),
    Case("fully masked rows", 1, 2, 2, 500, 120, 59, causal=True),
    Case("Nq = 1", 1, 4, 4, 1, 1025, 128, causal=True),
    Case("d = 1", 1, 1, 1, 70, 70, 1),
)
