"""The problem strategies draw tiles from what each registered pair accepts (a GPU campaign once
stopped on d > 224 in float64, where no tiled-forward candidate fitted 48 KiB), a user's
variant included."""

import numpy as np
import pytest

from numba_flash import registry
from numba_flash.kernels import forward_tiled
from numba_flash.testing.strategies import TILE_CANDIDATES, valid_tiles


@pytest.mark.parametrize("kind", ["forward", "backward"])
@pytest.mark.parametrize("kernel", ["rowwise", "tiled", "fa2"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_head_dim_has_a_tile_the_pair_accepts(kernel, kind, dtype):
    pair = registry.PAIRS[kernel]
    for d in (1, 7, 16, 59, 64, 100, 128, 200, 224, 256):
        tiles = valid_tiles(kernel, kind, d, dtype)
        assert tiles and all(pair.accepts(kind, *t, d, dtype) for t in tiles), (d, tiles)
    assert len(valid_tiles(kernel, kind, 16, dtype)) > 1      # something to be invariant over


def test_a_users_variant_gets_the_tiles_its_own_factory_accepts():
    """A variant whose forward takes only square tiles is drawn only square tiles."""
    def square_only(block_m, block_n, d, causal, dtype):
        if block_m != block_n:
            raise ValueError("square tiles only")
        return forward_tiled.make_forward_kernel(block_m, block_n, d, causal, dtype)
    registry.register(registry.variant("square (test)", "tiled", make_forward=square_only,
                                       forward_tiles=lambda d, dtype: (16, 16)))
    try:
        tiles = valid_tiles("square (test)", "forward", 16, np.float32)
        assert tiles and all(bm == bn for bm, bn in tiles)
        assert len(tiles) < len([t for t in TILE_CANDIDATES if t[0] == t[1]]) + 1
    finally:
        registry.unregister("square (test)")
