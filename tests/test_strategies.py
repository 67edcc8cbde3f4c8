"""The problem strategies can draw tiles for every head dim and dtype (a GPU campaign once
stopped on d > 224 in float64, where no tiled-forward candidate fitted 48 KiB)."""

import pytest

from numba_flash.testing.strategies import TILES, valid_tiles


@pytest.mark.parametrize("kind", sorted(TILES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_head_dim_has_a_tile(kind, dtype):
    empty = [d for d in range(1, 257) if not valid_tiles(kind, d, dtype)]
    assert not empty, f"{kind} {dtype}: no tile fits d = {empty}"
