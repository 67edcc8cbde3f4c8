"""Staging 16-bit tiles (tokens x head dim, as stored) into shared memory in wgmma16's
K-major layout, in 16-byte chunks: a chunk is 8 consecutive elements of one stored row
(src[head, row, 8 c : 8 c + 8]) and row r % 8 of core matrix (r // 8, c), so it moves in one
16-byte copy. Every tile of the 16-bit kernels is staged so; where a product needs it the
other way round (V in P V, Q in dS^T Q, ...) wgmma reads it transposed (wgmma16's b_rows).

A warp moves 8 rows x 4 chunks at a time (lane = row % 8 + 8 x chunk % 4): 64 contiguous
bytes of each of 8 stored rows (whole 32-byte sectors where rows are 32-byte aligned, d a
multiple of 16) into 4 whole core matrices (512 contiguous bytes of shared memory: no bank
conflicts).

Two ways, chosen per launch (vector_io.AlignedDispatch): asynchronous (vector_io.copy16,
cp.async; the caller commits, waits and fences) where the arrays' data pointers and rows are
16-byte aligned (d a multiple of 8), else synchronous element by element (any d, any view).
Elements past the rows n or the head dim d are staged as zeros.

The pipelines' tiles (K and V each block forward, Q and dO each block backward) are staged
asynchronously by a plan (make_plan): a thread works out once where its chunks come from and go
to, and each tile then costs it a 64-bit add, a compare and a cp.async a chunk.

The other way (make_store_rows): a warpgroup's 64 x D float32 accumulator (out, dK, dV) is
rounded into a 64 x D tile of shared memory by stmatrix and written out 16 bytes a lane,
instead of two bytes an entry (each such store touched 8 sectors for 8 bytes of each).
"""

import functools

from numba import cuda, uint16, uint64

from ..support import U, inlined_device_function, warp_barrier
from ..vector_io import copies_commit, copy16, copy16_at, store_words
from .wgmma16 import load_shared16, make_pack_half2, store_rows4

CHUNK = 8          # elements of a 16-byte chunk
NO_CHUNK = 0xFFFFFFFF   # a plan's entry for a chunk slot past the tile (or a row never staged)


def _layout(R, C, threads):
    """(C8, WBLOCKS, PER, EVEN, BLOCKS_C) of an R x C tile staged by `threads` threads: chunks a
    row, 8 x 4 chunk blocks (one a warp at a time), chunks a thread moves at most, whether the
    threads divide the chunks, blocks along the chunks."""
    C8 = C // CHUNK
    if R % 8 or C8 % 4 or threads % 32:
        raise ValueError(f"a {R} x {C} tile cannot be staged by {threads} threads in warps of "
                         f"8 rows x 4 chunks")
    return C8, R * C8 // 32, -(-R * C8 // threads), (R * C8) % threads == 0, C8 // 4


@functools.lru_cache(maxsize=None)
def make_chunk_at(R, C):
    """chunk_at(w, lane): (r, c, element offset in the tile) of the chunk `lane` of warp-block w
    of an R x C tile moves (row r, 16-byte chunk c)."""
    C8 = C // CHUNK
    BLOCKS_C, uC8 = C8 // 4, U(C8)

    @cuda.jit(device=True)
    def chunk_at(w, lane):
        r = (w // U(BLOCKS_C)) * U(8) + lane % U(8)
        c = (w % U(BLOCKS_C)) * U(4) + lane // U(8)
        return r, c, ((r // U(8)) * uC8 + c) * U(64) + (r % U(8)) * U(CHUNK)
    return chunk_at


@functools.lru_cache(maxsize=None)
def make_stage16(R, C, asynchronous, threads):
    """stage(sh, at, src, head, row0, n, d): the R x C tile src[head, row0 : row0 + R, :C]
    (zero past row n and column d) into the uint16 shared array sh at element offset `at`
    (a multiple of 8; wgmma16.core_offset16(r, c, C)), by `threads` threads (thread index
    modulo threads)."""
    _, WBLOCKS, PER, EVEN, _ = _layout(R, C, threads)
    # when the warps do not divide the blocks (3 warpgroups, a 64-row tile), the last round
    # skips blocks past the tile; otherwise no test (the code as it was)
    chunk_at = make_chunk_at(R, C)

    @cuda.jit(device=True)
    def stage(sh, at, src, head, row0, n, d):
        tid = U(cuda.threadIdx.x) % U(threads)
        for i in range(PER):
            w = tid // U(32) + U(i * (threads // 32))
            if not EVEN and w >= U(WBLOCKS):
                break
            r, c, off = chunk_at(w, tid % U(32))
            row, col = row0 + r, c * U(CHUNK)
            if asynchronous:
                ok = row < n and col < d
                copy16(sh, at + off, src, head, row if ok else U(0), col if ok else U(0),
                       U(16) if ok else U(0))
            else:
                for e in range(CHUNK):
                    x = uint16(0)
                    if row < n and col + U(e) < d:
                        x = src[head, row, col + U(e)]
                    sh[at + off + U(e)] = x
    return stage


@functools.lru_cache(maxsize=None)
def make_stage_pair(R, C, asynchronous, threads):
    """stage_pair(sh, at, x, y, head, row0, n, d): the R x C tiles of x and y (rows row0..)
    at `at` and R C elements further, as make_stage16's stage; asynchronous: one cp.async
    group of both (committed). The pipelines' next stage: K and V, or Q and dO."""
    stage = make_stage16(R, C, asynchronous, threads)

    @inlined_device_function
    def stage_pair(sh, at, x, y, head, row0, n, d):
        stage(sh, at, x, head, row0, n, d)
        stage(sh, at + U(R * C), y, head, row0, n, d)
        if asynchronous:
            copies_commit()
    return stage_pair


class Plan:
    """The asynchronous staging of R x C tiles by `threads` threads, worked out once a thread:

        rows, offsets, shared = (cuda.local.array(plan.PER, uint32) for _ in range(3))
        plan.start(rows, offsets, shared, row_bytes, d)          # once, before the loop
        plan.stage(sh, at, src, tile, left, rows, offsets, shared)   # a tile
        plan.stage_pair(sh, at, x, y, tile, left, rows, offsets, shared)  # two, one group

    row_bytes: the arrays' row stride in bytes (d 2 for the kernels' contiguous (B*H, N, d)
    arrays); tile: the byte offset of the tile's first row in src (head s0 + row0 s1, a
    uint64); left = n - row0 > 0, the rows there are (rows past it staged as zeros). x and y of
    stage_pair share their strides (K and V, Q and dO). Slot i of a thread is its i-th chunk:
    rows[i] its row in the tile (NO_CHUNK where its columns are past d: staged as zeros),
    offsets[i] its bytes past the tile's first row, shared[i] its element offset in the tile
    (NO_CHUNK: no chunk, the last round where the threads do not divide the tile)."""

    def __init__(self, R, C, threads):
        _, WBLOCKS, PER, EVEN, _ = _layout(R, C, threads)
        self.PER = PER
        chunk_at = make_chunk_at(R, C)
        CH = U(CHUNK)

        @cuda.jit(device=True)
        def start(rows, offsets, shared, row_bytes, d):
            tid = U(cuda.threadIdx.x) % U(threads)
            for i in range(PER):
                w = tid // U(32) + U(i * (threads // 32))
                r, c, off = chunk_at(w, tid % U(32))
                past = not EVEN and w >= U(WBLOCKS)
                shared[i] = U(NO_CHUNK) if past else off
                rows[i] = r if c * CH < d else U(NO_CHUNK)
                offsets[i] = r * row_bytes + c * U(16)

        @inlined_device_function
        def stage(sh, at, src, tile, left, rows, offsets, shared):
            for i in range(PER):
                if EVEN or shared[i] != U(NO_CHUNK):
                    ok = rows[i] < left
                    copy16_at(sh, at + shared[i], src,
                              tile + uint64(offsets[i]) if ok else uint64(0),
                              U(16) if ok else U(0))

        @inlined_device_function
        def stage_pair(sh, at, x, y, tile, left, rows, offsets, shared):
            stage(sh, at, x, tile, left, rows, offsets, shared)
            stage(sh, at + U(R * C), y, tile, left, rows, offsets, shared)
            copies_commit()

        self.start, self.stage, self.stage_pair = start, stage, stage_pair


@functools.lru_cache(maxsize=None)
def make_plan(R, C, threads):
    """The Plan of R x C tiles by `threads` threads (one a configuration)."""
    return Plan(R, C, threads)


@functools.lru_cache(maxsize=None)
def make_store_rows(D, fmt):
    """store_rows(sh, sm, dst, acc, words, scale0, scale1, tile_at, head, row0, warp, lane, n,
    d, scratch): the calling warp's 16 rows of a warpgroup's 64 x D float32 accumulator `acc`
    (an m64nD wgmma accumulator: entry j of lane 4 g + t at row 16 warp + g + 8 ((j % 4) // 2),
    column 8 (j // 4) + 2 t + j % 2), rows g times scale0 and rows g + 8 times scale1, rounded
    to fmt, into dst[head, row0 + r, :d] (uint16 patterns; only rows row0 + r < n). Through the
    64 x D tile at element tile_at of sh, which the caller has free: four 8 x 8 matrices a
    stmatrix (columns 16 i.. of rows g and g + 8; lane L gives row L % 8 of matrix L // 8),
    then a 16-byte chunk a lane, read back and stored (dst's data pointer and rows 16-byte
    aligned, d a multiple of 8: the asynchronous kernels' dispatch). words: a local uint32
    array of at least 4 entries to use. Only the warp reads the rows it writes: a warp barrier
    between (sm_90: stmatrix; on the simulator the model's exchanges are warpgroup barriers,
    so every thread of the warpgroup calls it)."""
    CHUNKS = D // CHUNK                     # 16-byte chunks of a row
    pack = make_pack_half2(fmt)

    @inlined_device_function
    def row_chunk_at(tile_at, r, chunk):
        """Element offset of chunk `chunk` of row r of the row-major 64 x D tile at tile_at; a
        row's chunks permuted by r % 8, so that one chunk of 8 rows (a matrix of stmatrix, a
        quarter of a warp's 16-byte loads) falls on all 32 banks."""
        return tile_at + r * U(D) + (chunk ^ (r % U(8))) * U(CHUNK)

    @inlined_device_function
    def store_rows(sh, sm, dst, acc, words, scale0, scale1, tile_at, head, row0, warp, lane,
                   n, d, scratch):
        mat = lane // U(8)
        r = warp * U(16) + (mat % U(2)) * U(8) + lane % U(8)
        for i in range(D // 16):
            for w in range(4):          # matrix w: columns 8 (2 i + w // 2).., rows 8 (w % 2)..
                j = 4 * (2 * i + w // 2) + 2 * (w % 2)
                scale = scale1 if w % 2 else scale0
                words[w] = pack(acc[j] * scale, acc[j + 1] * scale)
            store_rows4(sh, sm, row_chunk_at(tile_at, r, U(2 * i) + mat // U(2)), words, 0,
                        scratch)
        warp_barrier()
        for it in range(16 * CHUNKS // 32):
            at = U(32 * it) + lane
            r = warp * U(16) + at // U(CHUNKS)
            c = at % U(CHUNKS)
            chunk = load_shared16(sh, row_chunk_at(tile_at, r, c))
            if row0 + r < n and c * U(CHUNK) < d:
                store_words(dst, head, row0 + r, c * U(CHUNK), chunk)
    return store_rows
