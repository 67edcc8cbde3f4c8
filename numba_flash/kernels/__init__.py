"""The kernels, by family (kernels/README.md has the table). Registered as pairs in
numba_flash/registry.py; nothing here registers itself.

    rowwise: forward_rowwise.py        the readable forward: one thread per query row
    tiled:   forward_tiled.py, backward.py (the tiled backward and the preprocess kernel)
    fa2:     forward_fa2.py, backward_fa2.py, fa2_tiles.py, fa2_mma.py (mma.sync TF32)
    wgmma:   sm90/ (operands, softmax, forward, backward, dq, wgmma instruction wrappers)
    shared:  support.py (Numba helpers, simulator shims, P from lse), vector_io.py, mma.py
"""
