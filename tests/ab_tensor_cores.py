"""A/B of fa2-atomic's dK/dV products, FFMA against tensor cores (3xTF32: the accumulating
products; those and dP, dp_tensor_cores; and those with P^T and dS^T kept in registers,
p_in_registers), default tiles with prefetch (and 32 x 128 at d = 128),
alternating, two rounds in one process on the same inputs, at N = 1k and 2k, d = 64 and 128
(bench grid), for a GPU (not a pytest module): one process and alternation keep the
run-to-run noise (several percent on the H200) out of the comparison.

    python tests/ab_tensor_cores.py
"""
import numpy as np
from numba import cuda
from numba_flash import tune
from numba_flash.bench import _median_ms
import reference as ref

rng = np.random.default_rng(0)
for d, (bm, bn) in ((64, (64, 128)), (128, (64, 64))):
    for n in (1024, 2048):
        bh = (16384 // n) * (2048 // d)
        q, k, v, do = (cuda.to_device(rng.standard_normal((bh, n, d), dtype=np.float32)) for _ in range(4))
        out, lse = tune._launch_forward((128, 64, (16, 16)), q, k, v, kernel="fa2")
        flops = 2.5 * ref.forward_flops(n, n, d, False, bh)
        configs = {"FFMA": (bm, bn, (16, 16), True, True, False),
                   "tensor cores": (bm, bn, (16, 16), None, True, True),
                   "tensor cores + dP": (bm, bn, (16, 16), None, True, True, True, False),
                   "tensor cores + dP, P in registers":
                       (64, 128, (16, 16), None, True, True, True, True)}
        if d == 128:     # 16 rows of K per warp (P in registers) at d = 128: 32 x 128 tiles
            configs["tensor cores + dP, P in registers"] = (32, 128, (16, 16), None, True, True,
                                                            True, True)
            configs["tensor cores + dP, 32 x 128"] = (32, 128, (16, 16), None, True, True, True,
                                                      False)
            configs["FFMA, 32 x 128"] = (32, 128, (16, 16), True, True, False)
        bm_r, bn_r = configs["tensor cores + dP, P in registers"][:2]
        configs["tensor cores + dP, P in registers, no prefetch"] = (
            bm_r, bn_r, (16, 16), None, False, True, True, True)
        for rnd in range(2):
            for name, cfg in configs.items():
                ms = _median_ms(lambda: tune._launch_backward(cfg, do, q, k, v, out, lse,
                                                              kernel="fa2-atomic"))
                print(f"d={d} N={n} round {rnd} {name}: {flops / ms / 1e9:.1f} TFLOP/s",
                      flush=True)
