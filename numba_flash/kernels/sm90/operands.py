"""The operands of the Hopper family (sm_90a, wgmma 3xTF32): how Q, K, V, dO and the
score tiles are staged in shared memory and read into register fragments, for both
directions. The forward and the backward form S = (scale Q) K^T from these pieces, so that
the backward's P = exp(S - lse) is the forward's bit for bit (at logits of 1e4 an ulp of S
moves P by percents):

- d <= 64 (one warpgroup, 64 x 64 tiles): A = scale Q as register fragments holding the TF32
  parts of q * scale (`make_global_fragment`: the backward reads them from global memory, the
  forward from its staged Q tile, whose parts `make_stage` splits the same way), B = the K tile
  of `make_stage(False, permuted=True)`, the contraction permuted within each step on both
  sides (position k holds column 2 (k % 4) + k // 4: a thread's A entries t, t + 4 are
  adjacent columns, one 8-byte load); 8 steps of 8, each summed from zero on the tensor core
  and added in step order (sm90.forward pairs S's steps per wait, sm90.backward pairs S with
  dP: the same sums).
- 64 < d <= 128 (two warpgroups, the head dim in two halves of 64): four products of CHAIN = 4
  steps chained in the tensor core, A from `make_chain_fragments(permuted=True)` (each
  thread's entries runs of 8 contiguous columns, `chain_column`), B = K staged with
  `make_stage(chain_permuted=True)`, the four chains added in order.
The forward forms S with make_lean_s / make_wide_s, and the deterministic dQ pass (d > 64)
with make_wide_s too; the dK/dV kernels with the same fragments and products, loaded a step ahead
(sm90.backward): the same values in the same sums.

Layout (wgmma.core_offset): a 64 x 64 tile of floats, K-major, as its big and small TF32
parts (mma.split_tf32), TILE floats each, the small part TILE floats after the big one.
"""

import functools

from numba import cuda, float32

from ..mma import split_tf32
from ..support import NEG_INF, U, device_function, inlined_device_function
from ..vector_io import copies_commit, copy16, load2, load2_below, load2_row, load4_below
from .wgmma import CHAIN, STEP, WARPGROUP, products

BLOCK = 64                  # block_m = block_n
D_PAD = 64                  # the head dim, zero-padded
TILE = BLOCK * D_PAD        # floats per tile
STEPS = 64 // STEP          # 8-long steps of every product (K = d, i or j: all 64)
REGS = 32                   # accumulator entries per thread of a 64 x 64 product
LOADS = 8                   # global loads a thread has in flight when staging a tile
STEP_FLOATS = 64            # floats from one 8-long step of a staged tile to the next
HALF = 2 * TILE             # floats of one staged tile, big then small
CHAIN_A = 4 * CHAIN         # a thread's A-fragment entries of one chained product (wgmma.py)


@device_function
def chain_column(c):
    """The source column that column c of a chain-permuted tile holds. Within each 32 columns
    (one chained product of CHAIN = 4 steps of 8), contraction index 8 s + t + 4 e (step s,
    t = lane % 4 of the register A fragment, e = 0 or 1 its two k entries) is column
    8 t + 2 s + e: each thread's 8 entries of a row are then 8 contiguous columns."""
    k = c % U(32)
    return c - k + U(8) * (k % U(4)) + U(2) * (k // U(8)) + (k % U(8)) // U(4)


PER_THREAD = TILE // WARPGROUP      # a tile's elements per thread of a warpgroup


def _tile_access(transposed, permuted, per_warpgroup, chain_permuted, count):
    """(coords, load, put, position) of a staged tile's layout (make_stage's options):
    coords() the thread's part (r_t, c_t) of its elements' positions; load(src, head, row0,
    col0, n, d, mult, x, r_t, c_t) its element x * 128 + tid (times mult), zero outside src;
    put(sm, at, vals, x0) vals[u] (count of them) split into TF32 parts and stored as its
    elements (x0 + u) * 128 + tid, big at sm[at + ...] and small TILE floats on;
    position(x, r_t, c_t) where element x * 128 + tid comes from in the source block."""
    CHAIN_PERMUTED = chain_permuted and not transposed

    @device_function
    def contraction_index(c_t):
        if permuted:
            return c_t - c_t % U(8) + U(2) * (c_t % U(4)) + (c_t % U(8)) // U(4)
        return c_t

    @cuda.jit(device=True)
    def thread_index():
        tid = U(cuda.threadIdx.x)
        if per_warpgroup:
            tid %= U(WARPGROUP)
        return tid

    @cuda.jit(device=True)
    def coords():
        # element idx = tid + 128 x of the layout is (r, c) = (8 (x // 4) + r_t,
        # 16 (x % 4) + c_t): core_offset's inverse, with the thread's part computed once
        # (uint32 index math throughout: Python ints are int64 in Numba, and signed
        # division and index wraparound cost instructions in every iteration)
        tid = thread_index()
        return (tid // U(4)) % U(8), contraction_index((tid // U(32)) * U(4) + tid % U(4))

    @cuda.jit(device=True)
    def position(x, r_t, c_t):
        """(row, column) in the source block of the thread's element x * 128 + tid."""
        r = U(8 * (x // 4)) + r_t
        c = U(16 * (x % 4)) + c_t
        if CHAIN_PERMUTED:
            c = chain_column(c)
        if transposed:
            r, c = c, r
        return r, c

    @cuda.jit(device=True)
    def load(src, head, row0, col0, n, d, mult, x, r_t, c_t):
        r, c = position(x, r_t, c_t)
        c += col0
        val = float32(0.0)
        if row0 + r < n and c < d:
            val = src[head, row0 + r, c] * mult
        return val

    @cuda.jit(device=True)
    def put(sm, at, vals, x0):
        tid = thread_index()
        for u in range(count):      # a warp writes one 512-byte run
            idx = tid + U((x0 + u) * WARPGROUP)
            big, small = split_tf32(vals[u])
            sm[at + idx] = big
            sm[at + TILE + idx] = small

    return coords, load, put, position


def make_stage(transposed, permuted=False, loads=LOADS, per_warpgroup=False,
               chain_permuted=False):
    """stage(sm, at, src, head, row0, col0, d, mult) for tiles K-major over the head dim
    (transposed: over the rows).
    permuted: within each 8-group of the contraction, position k holds row (transposed) or
    column 2 (k % 4) + k // 4. Transposed, a C fragment is then a register A fragment against
    this tile (sm90.forward: O += P V with V^T so staged); not transposed (d <= 64's K, V and
    scale Q: step_permuted), a thread's two contraction entries t and t + 4 of a register A
    fragment are adjacent columns 2 t and 2 t + 1, one 8-byte load. loads: stage's batch of
    global loads in flight (a divisor of 32). per_warpgroup: stage runs in a block of several
    warpgroups, each staging its own tiles (thread index taken modulo 128; a separate option
    because that one instruction moved ptxas's allocation of the timed one-warpgroup forward,
    170 -> 188 registers). chain_permuted (not transposed): the tile's column c holds the
    source's column chain_column(c), so that a chained product's register A fragments, loaded by
    make_chain_fragments(permuted=True), are runs of 8 contiguous columns (see there)."""
    BATCH = loads
    coords, load, put, _ = _tile_access(transposed, permuted, per_warpgroup, chain_permuted,
                                         BATCH)

    @cuda.jit(device=True)
    def stage(sm, at, src, head, row0, col0, d, mult):
        """Rows row0.. and head-dim columns col0..col0 + 63 of src[head] (times mult; zero
        past its rows or the head dim) as a 64 x 64 tile, K-major over the head dim
        (transposed: over the rows, the tile's rows being the head dim), at sm[at] (big) and
        sm[at + TILE] (small), by 128 threads (per_warpgroup: those of the caller's).
        Thread-index order is the layout's own, so a warp writes one 512-byte run; the loads
        go in batches of `loads`, so that a batch is in flight at once (one warp per
        scheduler has nothing else to hide a load's latency behind)."""
        n = U(src.shape[1])
        r_t, c_t = coords()
        vals = cuda.local.array(BATCH, float32)
        for b in range(PER_THREAD // BATCH):
            for u in range(BATCH):
                vals[u] = load(src, head, row0, col0, n, d, mult, b * BATCH + u, r_t, c_t)
            put(sm, at, vals, b * BATCH)

    return stage


def make_fetch(permuted=False):
    """(fetch, put): make_stage(False, permuted)'s tile (K-major over the head dim, one
    warpgroup's, mult 1) in two halves, for a tile staged a block ahead through registers
    (sm90.forward's K). fetch(vals, src, head, row0, col0, d) loads the thread's PER_THREAD =
    32 elements of it into vals, all in flight at once; put(sm, at, vals) splits and stores
    them later, as stage would have, bit for bit."""
    coords, load, put_all, _ = _tile_access(False, permuted, False, False, PER_THREAD)

    @cuda.jit(device=True)
    def fetch(vals, src, head, row0, col0, d):
        n = U(src.shape[1])
        r_t, c_t = coords()
        for x in range(PER_THREAD):
            vals[x] = load(src, head, row0, col0, n, d, float32(1.0), x, r_t, c_t)

    @cuda.jit(device=True)
    def put(sm, at, vals):
        put_all(sm, at, vals, 0)

    return fetch, put


# A raw block: 64 rows x `columns` (128: the wide kernels' head dim; 64: the lean forward's V)
# of float32 as stored, in shared memory row-major, each row padded by 4 floats so that the 8
# rows a warp's staging reads at once start in different banks.
RAW_ROWS, RAW_COLUMNS = BLOCK, 2 * D_PAD


def raw_stride(columns=RAW_COLUMNS):
    """Floats from one row of a raw block to the next."""
    return columns + 4


def raw_floats(columns=RAW_COLUMNS):
    """Floats of a raw block of 64 rows x columns."""
    return RAW_ROWS * raw_stride(columns)


RAW_FLOATS = raw_floats()


def make_fetch_raw(threads, columns=RAW_COLUMNS, column_once=False):
    """fetch_raw(sm, raw, src, head, row0, n, d): src[head, row0 : row0 + 64, :columns] into
    the raw block at sm[raw] by cp.async (16 bytes a copy, 64 * columns / 4 / threads a
    thread; zeros past row n and column d, where d % 4 == 0), committed as one group of the
    thread's: the caller waits for it (copies_wait), then a block barrier, before reading it.
    Needs src's data and rows 16-byte aligned (vector_io.aligned).
    Copy u of thread tid is the 4 columns at 4 (i % (columns / 4)), row i // (columns / 4),
    of i = tid + u threads: the same column in every copy. column_once: that column and its
    bound check formed once, not per copy (the same copies; only ptxas's allocation differs):
    the lean forward's form (its timed kernel); the wide forward ran 0.97-1.05x with it (d =
    128, H100, 2026-12-07: allocation, not work), so it keeps the per-copy form."""
    COPIES = RAW_ROWS * columns // 4 // threads
    STRIDE = raw_stride(columns)
    PER_ROW = columns // 4          # copies a row
    # (every thread the same count of copies; column_once: a whole number of rows a round)
    assert COPIES * threads == RAW_ROWS * PER_ROW and threads % PER_ROW == 0

    @cuda.jit(device=True)
    def fetch_raw(sm, raw, src, head, row0, n, d):
        tid = U(cuda.threadIdx.x)
        r_t, c_t = tid // U(PER_ROW), (tid % U(PER_ROW)) * U(4)
        c_ok = c_t < d
        for u in range(COPIES):
            if column_once:
                r, c = r_t + U(u * threads // PER_ROW), c_t
                ok = row0 + r < n and c_ok
            else:
                i = tid + U(u * threads)
                r, c = i // U(PER_ROW), (i % U(PER_ROW)) * U(4)
                ok = row0 + r < n and c < d
            copy16(sm, raw + r * U(STRIDE) + c, src, head, row0 + r if ok else U(0),
                   c if ok else U(0), U(16) if ok else U(0))
        copies_commit()

    return fetch_raw


def make_stage_raw(transposed, permuted=False, chain_permuted=False, loads=LOADS,
                   columns=RAW_COLUMNS):
    """stage_raw(sm, at, raw, col0): make_stage's stage (per_warpgroup, mult 1) of the raw
    block of `columns` at sm[raw] (make_fetch_raw), its columns col0..col0 + 63: the same tile
    bit for bit (the raw block holds zeros where stage reads none), from shared memory."""
    coords, _, put, position = _tile_access(transposed, permuted, True, chain_permuted, loads)
    STRIDE = raw_stride(columns)

    @cuda.jit(device=True)
    def stage_raw(sm, at, raw, col0):
        r_t, c_t = coords()
        vals = cuda.local.array(loads, float32)
        for b in range(PER_THREAD // loads):
            for u in range(loads):
                r, c = position(b * loads + u, r_t, c_t)
                vals[u] = sm[raw + r * U(STRIDE) + col0 + c]
            put(sm, at, vals, b * loads)

    return stage_raw


@device_function
def add(acc, part):
    for j in range(REGS):
        acc[j] += part[j]

@device_function
def add2(acc, acc2, part):
    for j in range(REGS):
        acc[j] += part[j]
    for j in range(REGS):
        acc2[j] += part[REGS + j]

@device_function
def add_in_turn(acc, part):
    """acc += part[:REGS], then acc += part[REGS:] (two steps of one product, in step order)."""
    for j in range(REGS):
        acc[j] += part[j]
    for j in range(REGS):
        acc[j] += part[REGS + j]

@device_function
def clear(acc):
    for j in range(REGS):
        acc[j] = float32(0.0)

@device_function
def transposed_fragment_chain_paired(sm, at, s, warp, lane):
    """The register A fragment (big, small) of step s of X^T, X the 64 x 64 chain-permuted tile
    at sm[at] (make_stage's chain_permuted: its column b holds source column chain_column(b)),
    X^T's rows paired: the thread's rows g and g + 8 of the warp's 16 are source columns 16 warp
    + 2 g and + 1, read from the tile's columns that hold them (the second 4 after the first).
    A product with this A has those rows in its accumulator's entries e and e + 2: for dQ^T =
    K^T dS^T, two adjacent head-dim columns of one dq row (sm90.backward.add_dq_pairs)."""
    # core_offset(8 s + t (+ 4), b (+ 4), 64) with b = 32 (warp // 2) + 8 (g % 4)
    # + 2 (warp % 2) + g // 4, the column holding source column 16 warp + 2 g
    g, t = lane // U(4), lane % U(4)
    o0 = (at + U(512) * U(s) + (U(8) * (warp // U(2)) + U(2) * (g % U(4))) * U(32) + t * U(4)
          + U(2) * (warp % U(2)) + g // U(4))
    o1, o2, o3 = o0 + U(32), o0 + U(16), o0 + U(48)
    return ((sm[o0], sm[o1], sm[o2], sm[o3]),
            (sm[o0 + U(TILE)], sm[o1 + U(TILE)], sm[o2 + U(TILE)], sm[o3 + U(TILE)]))


def make_global_fragment(transposed, split=True, paired=False, vector=False,
                         step_permuted=False, below=False):
    """global_fragment (below); split=False: global_elements(src, head, row0, s, d, warp, lane),
    its four elements as loaded (not yet times mult), to be scaled and split later by
    split_fragment(x, mult) (sm90.backward loads a step ahead of their use: a multiply at the
    load would wait for it there, Nsight Compute 2026-12-06).
    paired (transposed, split=False): X^T's rows paired: the thread's rows g and g + 8 of the
    warp's 16 are X^T's rows 16 warp + 2 g and + 1, two adjacent columns of one src row; a
    product with this A has those rows in its accumulator's entries e and e + 2
    (sm90.backward.store_dkdv). vector (with paired): each
    pair one 8-byte load (vector_io.load2: src's data and rows 16-byte aligned and d % 4 == 0,
    the caller's promise), else element by element; below (with vector): the two pairs of a
    step read at rows row0 + t + 8 s (+ 4) as offsets below (head, row0 + t, r)'s address
    (vector_io.load2_below: the wide backward's, 1.05-1.08x; the lean one keeps load2, whose
    loop the offsets lengthened, docs/experiments.md rows 49, 52).
    step_permuted (not transposed): X's contraction permuted within each step as
    make_stage(permuted=True) stages a B tile (contraction index t + 4 e holds column 2 t + e):
    the thread's elements X[r, c], X[r + 8, c], X[r, c + 1], X[r + 8, c + 1], c = 8 s + 2 t,
    a pair of adjacent columns a row (read as 8-byte pairs from row views:
    make_row_elements_permuted)."""
    PAIRED, VECTOR = paired and transposed, vector and paired and transposed
    PERMUTED = step_permuted and not transposed
    BELOW = below
    zeros2 = (float32(0.0), float32(0.0))

    @device_function
    def element(src, head, row0, r, c, mult, n, d):
        if transposed:                         # X^T[r, c] = src[row0 + c, r]
            r, c = c, r
        x = float32(0.0)
        if row0 + r < n and c < d:
            x = src[head, row0 + r, c] * mult
        return x

    @device_function
    def global_fragment(src, head, row0, s, mult, d, warp, lane):
        """The register A fragment (big, small) of step s of X = mult src[head, row0:row0+64, :]
        (transposed: of X^T), read from global memory and split, entries in
        wgmma.a_fragment_index's order; zero outside src."""
        n = U(src.shape[1])
        r = warp * U(16) + lane // U(4)
        if PERMUTED:        # (step_permuted) the k entries t, t + 4: columns 2 t, 2 t + 1
            c = U(STEP * s) + U(2) * (lane % U(4))
            c4 = c + U(1)
        else:
            c = U(STEP * s) + lane % U(4)
            c4 = c + U(4)
        b0, s0 = split_tf32(element(src, head, row0, r, c, mult, n, d))
        b1, s1 = split_tf32(element(src, head, row0, r + U(8), c, mult, n, d))
        b2, s2 = split_tf32(element(src, head, row0, r, c4, mult, n, d))
        b3, s3 = split_tf32(element(src, head, row0, r + U(8), c4, mult, n, d))
        return (b0, b1, b2, b3), (s0, s1, s2, s3)

    @device_function
    def global_elements(src, head, row0, s, d, warp, lane):
        n = U(src.shape[1])
        one = float32(1.0)
        c = U(STEP * s) + lane % U(4)
        if PAIRED:
            r = warp * U(16) + U(2) * (lane // U(4))         # X^T's rows r, r + 1
            if VECTOR and BELOW:    # rows row0 + t + 8 s (+ 4) as offsets below one address
                t = lane % U(4)
                lo = (load2_below(src, head, row0 + t, r, U(STEP * s)) if U(row0 + c) < n and
                      r < d else zeros2)
                hi = (load2_below(src, head, row0 + t, r, U(STEP * s + 4))
                      if U(row0 + c + U(4)) < n and r < d else zeros2)
                return lo[0], lo[1], hi[0], hi[1]
            if VECTOR:  # d % 4 == 0, r even: both columns inside or both out
                lo = load2(src, head, row0 + c, r) if row0 + c < n and r < d else zeros2
                hi = (load2(src, head, row0 + c + U(4), r) if row0 + c + U(4) < n and r < d
                      else zeros2)
                return lo[0], lo[1], hi[0], hi[1]
            return (element(src, head, row0, r, c, one, n, d),
                    element(src, head, row0, r + U(1), c, one, n, d),
                    element(src, head, row0, r, c + U(4), one, n, d),
                    element(src, head, row0, r + U(1), c + U(4), one, n, d))
        r = warp * U(16) + lane // U(4)
        if PERMUTED:        # (step_permuted) the k entries t, t + 4: columns 2 t, 2 t + 1
            c = U(STEP * s) + U(2) * (lane % U(4))
            c4 = c + U(1)
        else:
            c4 = c + U(4)
        return (element(src, head, row0, r, c, one, n, d),
                element(src, head, row0, r + U(8), c, one, n, d),
                element(src, head, row0, r, c4, one, n, d),
                element(src, head, row0, r + U(8), c4, one, n, d))
    return global_fragment if split else global_elements


@device_function
def row_views(src, head, i0, i1):
    """(row0, row1): src[head, i0] and src[head, i1] as 1-D views, a row past the last one
    clamped to it (its elements are never read: the readers' valid flags), so that a loop over
    steps indexes them by column alone (global_elements' addresses were formed in 64 bits
    from (head, row, column) at every step)."""
    last = U(src.shape[1]) - U(1)
    return src[head, min(i0, last)], src[head, min(i1, last)]


@functools.lru_cache(maxsize=None)
def make_row_elements_permuted(vector):
    """row_elements_permuted(row0, row1, valid0, valid1, s, d, lane): make_global_fragment's
    global_elements (step_permuted) of step s from row_views' rows: X[r, c], X[r + 8, c],
    X[r, c + 1], X[r + 8, c + 1], c = 8 s + 2 (lane % 4); zero on a row that is not valid
    (past the last) and past column d. vector: each row's pair one 8-byte load
    (vector_io.load2_row: rows 8-byte aligned and d even, the caller's promise)."""
    zeros2 = (float32(0.0), float32(0.0))

    @device_function
    def row_elements_permuted(row0, row1, valid0, valid1, s, d, lane):
        c = U(STEP * s) + U(2) * (lane % U(4))
        c1 = c + U(1)
        zero = float32(0.0)
        if vector:     # c even, d even: both columns inside or both out
            lo = load2_row(row0, c) if valid0 and c < d else zeros2
            hi = load2_row(row1, c) if valid1 and c < d else zeros2
            return lo[0], hi[0], lo[1], hi[1]
        return (row0[c] if valid0 and c < d else zero,
                row1[c] if valid1 and c < d else zero,
                row0[c1] if valid0 and c1 < d else zero,
                row1[c1] if valid1 and c1 < d else zero)
    return row_elements_permuted


@device_function
def transposed_fragment_paired_permuted(sm, at, s, warp, lane):
    """transposed_fragment_chain_paired for a step-permuted tile (make_stage(False,
    permuted=True): in each 8-group its column k holds source column 2 (k % 4) + k // 4): the
    thread's rows g and g + 8 are source columns 16 warp + 2 g and + 1, read from the tile's
    columns that hold them, 16 warp + 8 (g // 4) + g % 4 and 4 on (4-byte shared loads where
    an unpermuted tile's pair was adjacent)."""
    # core_offset(8 s + t (+ 4), b (+ 4), 64) with b = 16 warp + 8 (g // 4) + g % 4
    g, t = lane // U(4), lane % U(4)
    o0 = at + U(512) * U(s) + (warp * U(4) + U(2) * (g // U(4))) * U(32) + t * U(4) + g % U(4)
    o1, o2, o3 = o0 + U(32), o0 + U(16), o0 + U(48)
    return ((sm[o0], sm[o1], sm[o2], sm[o3]),
            (sm[o0 + U(TILE)], sm[o1 + U(TILE)], sm[o2 + U(TILE)], sm[o3 + U(TILE)]))


@functools.lru_cache(maxsize=None)
def make_chain_fragments(transposed, permuted=False, vector=False, paired=False):
    """chain_elements(x, src, head, row0, s0, d, warp, lane): the elements of the register A
    fragments of steps s0..s0 + CHAIN of src[head, row0:row0+64, :] (transposed: of its
    transpose; make_global_fragment's X without mult) into the local array x, step s0 + s's
    four at 4 s..; with split_chain(a_big, a_small, x, mult), the A operand of wgmma's
    chained_3xtf32_regs for X = mult src (the same TF32 parts as global_fragment's).
    permuted (not transposed): X's contraction index permuted by chain_column, against a B tile
    staged so (make_stage's chain_permuted): a thread's 8 entries of each of its two rows are
    then 8 contiguous columns, 8 (lane % 4).. of the chain's 32, read as one run. vector (with
    permuted): each run as two 16-byte loads at offsets below one (head, row, 8 (lane % 4))
    address (vector_io.load4_below: src's data and rows 16-byte aligned, d % 4 == 0, the
    caller's promise), else element by element.
    paired (transposed): X^T's rows paired (make_global_fragment's paired; with vector, 8-byte
    loads below one address, its below)."""
    elements = make_global_fragment(transposed, split=False, paired=paired, vector=vector,
                                    below=True)
    PERMUTED, VECTOR = permuted and not transposed, vector and permuted and not transposed
    zeros = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))

    @device_function
    def run_of_8(src, head, row, c, n, d, x, h):
        """src[head, row, c:c + 8] (zero outside src) element by element into x as rows h (0:
        the thread's first row, 1: the one 8 below) of a chain's fragments: column c + 2 s + e
        is step s's entry of k index lane % 4 + 4 e (chain_column)."""
        for u in range(8):
            val = float32(0.0)
            if row < n and c + U(u) < d:
                val = src[head, row, c + U(u)]
            x[4 * (u // 2) + 2 * (u % 2) + h] = val

    @device_function
    def chain_elements(x, src, head, row0, s0, d, warp, lane):
        if PERMUTED and VECTOR:     # as run_of_8's, offsets below one (head, r, t) address
            n = U(src.shape[1])
            r = U(row0 + warp * U(16) + lane // U(4))
            t = U(U(8) * (lane % U(4)))
            c = U(U(STEP) * s0 + t)
            for h in range(2):
                down = U(8 * h)
                lo = (load4_below(src, head, r, t, down, U(STEP) * s0)
                      if U(r + down) < n and c < d else zeros)
                hi = (load4_below(src, head, r, t, down, U(STEP) * s0 + U(4))
                      if U(r + down) < n and U(c + U(4)) < d else zeros)
                for u in range(4):
                    x[4 * (u // 2) + 2 * (u % 2) + h] = lo[u]
                    x[4 * (2 + u // 2) + 2 * (u % 2) + h] = hi[u]
        elif PERMUTED:
            n = U(src.shape[1])
            r = row0 + warp * U(16) + lane // U(4)
            c = U(STEP) * s0 + U(8) * (lane % U(4))
            run_of_8(src, head, r, c, n, d, x, 0)
            run_of_8(src, head, r + U(8), c, n, d, x, 1)
        else:
            for s in range(CHAIN):
                e4 = elements(src, head, row0, s0 + s, d, warp, lane)
                for e in range(4):
                    x[4 * s + e] = e4[e]
    return chain_elements


@device_function
def split_chain(a_big, a_small, x, mult):
    """a_big, a_small = the TF32 parts of x * mult, entry by entry (CHAIN_A entries)."""
    for j in range(CHAIN_A):
        a_big[j], a_small[j] = split_tf32(x[j] * mult)


@device_function
def split_fragment(x, mult):
    """(big, small) of a fragment's four elements times mult: what global_fragment returns
    (mult: 1 or a positive scale, so a zero outside src stays +0 as there)."""
    b0, s0 = split_tf32(x[0] * mult)
    b1, s1 = split_tf32(x[1] * mult)
    b2, s2 = split_tf32(x[2] * mult)
    b3, s3 = split_tf32(x[3] * mult)
    return (b0, b1, b2, b3), (s0, s1, s2, s3)



@device_function
def row_stats(lse, Dvec, bh, i0, i1, nq):
    """lse and D of query rows i0 and i1 (-inf and 0 past nq)."""
    lse0 = lse[bh, i0] if i0 < nq else float32(NEG_INF)
    lse1 = lse[bh, i1] if i1 < nq else float32(NEG_INF)
    D0 = Dvec[bh, i0] if i0 < nq else float32(0.0)
    D1 = Dvec[bh, i1] if i1 < nq else float32(0.0)
    return lse0, lse1, D0, D1


@functools.lru_cache(maxsize=None)
def make_lean_s(k_at, scratch_at, half=False):
    """s_steps(sm, s_acc, q_at, s) for d <= 64: s_acc += steps s and s + 1 of (scale Q) K^T in
    one tensor-core wait (each from zero, added in step order), A = scale Q's fragments from
    its staged tile (q_at = the tile's offset + core_offset(16 warp + lane // 4, lane % 4, 64)
    = offset + 1024 warp + lane), B = the K tile at sm[k_at]; call with s = 0, 2, 4, 6.
    half: K holds half inputs (exact in TF32), so the products with its zero small part are
    not issued (wgmma.products' exact="b"): the same S."""
    step2_regs = products(BLOCK, D_PAD, D_PAD, "b" if half else None)["step2_3xtf32_regs"]
    K_AT, SCRATCH_AT = k_at, scratch_at

    @inlined_device_function
    def q_fragment(sm, o):
        """scale Q's register A fragment (big, small) of step s, o = q_at + 64 s: the
        fragment's other entries 32, 512 and 544 floats on (wgmma.a_fragment_index: k + 4,
        row + 8, both)."""
        return ((sm[o], sm[o + U(512)], sm[o + U(32)], sm[o + U(544)]),
                (sm[o + U(TILE)], sm[o + U(TILE + 512)], sm[o + U(TILE + 32)],
                 sm[o + U(TILE + 544)]))

    @inlined_device_function
    def s_steps(sm, s_acc, q_at, s):
        a_big, a_small = q_fragment(sm, q_at + U(STEP_FLOATS * s))
        a2_big, a2_small = q_fragment(sm, q_at + U(STEP_FLOATS * (s + 1)))
        add_in_turn(s_acc, step2_regs(sm, a_big, a_small, U(K_AT), U(K_AT + TILE), a2_big,
                                      a2_small, U(K_AT + STEP_FLOATS),
                                      U(K_AT + TILE + STEP_FLOATS), s, U(SCRATCH_AT)))
    return s_steps


@functools.lru_cache(maxsize=None)
def make_wide_s(k_at, vector_loads, half=False):
    """s_chain(sm, s_acc, q, bh, row0, scale, d, warp, lane, g, x, a_big, a_small, scratch) for
    64 < d <= 128: s_acc += steps CHAIN g.. of (scale Q) K^T as one product chained in the
    tensor core (one wait); A = scale Q's permuted chain fragments read from global memory
    into x and split into a_big, a_small (CHAIN_A-entry local arrays), B = K's column half
    g // 2 staged chain-permuted at sm[k_at] (HALF floats per half); call with g = 0..3.
    vector_loads: q's runs of 8 read 16 bytes at a time (q 16-byte aligned, d % 4 == 0).
    half: as make_lean_s's (B, here K or V, exact in TF32)."""
    chained_regs = products(BLOCK, D_PAD, D_PAD, "b" if half else None)["chained_3xtf32_regs"]
    chain_elements = make_chain_fragments(False, True, vector_loads)
    K_AT = k_at

    @inlined_device_function
    def s_chain(sm, s_acc, q, bh, row0, scale, d, warp, lane, g, x, a_big, a_small, scratch):
        chain_elements(x, q, bh, row0, U(CHAIN * g), d, warp, lane)
        split_chain(a_big, a_small, x, scale)
        b_at = U(K_AT + HALF * (CHAIN * g // STEPS))
        add(s_acc, chained_regs(sm, a_big, a_small, b_at, b_at + U(TILE), (CHAIN * g) % STEPS,
                                scratch))
    return s_chain
