"""A list schedule of a causal grid's blocks in launch order: how far past the even share of
the work its last block ends, for the launch orders a kernel can take (no GPU needed).

    python tools/block_schedule.py [--sms 132] [--d 128] [--n 1024 4096 16384]

Under causal masking the blocks of a grid differ in work: a forward's query block sees the
keys up to its diagonal, a backward's K/V block is seen by the query rows from its diagonal
on. Blocks start in launch order (grid x fastest, then the head) on whichever SM frees first.
The model: a block's time is its number of K/V (forward) or Q (backward) blocks; `slots`
blocks an SM; no L2, no memory, no per-block overhead. Orders:

    head by head    each head's blocks heaviest first, then the next head's (the wide
                    forward before 2026-12-07 06:00, support.query_block_first_heaviest;
                    the backward's K/V block 0 is its heaviest)
    round the heads every head's heaviest block, then every head's next, in chunks of
                    `chunk` blocks a head (support.make_block_order)

What it got right and wrong (H100, 2026-12-07, docs/experiments.md row 44): for the d = 128
causal forward it gives 7.4 / 7.0 / 0.9 % past the even share head by head at N = 1k / 4k /
16k and 0.3 / 0.4 / 0.1 % round the heads; the GPU ran the forward round the heads 1.002 /
1.048 / 1.052x: a gain where the model has none (16k) and none where it has the most (1k),
so the tail is not what moved (L2 and DRAM locality change with the order too). For the
backward it gives 3.5 / 2.9 / 0.1 % and 0.1 %, and the GPU ran it 0.92 / 0.97 / 0.99x: its
blocks of one head, side by side, share Q and dO in L2, which the model does not have. A
first look, then, not a prediction. FlashAttention's grid: B * N = 16k, H = 2048 / d.
"""

import argparse
import heapq


def forward_work(n, block_m=128, block_n=64):
    """Work of each query block x of a causal forward at Nq = Nk = n (query blocks of block_m
    rows, K/V blocks of block_n keys): the K/V blocks up to its last row's diagonal."""
    blocks = -(-n // block_m)
    return [-(-min(n, (x + 1) * block_m) // block_n) for x in range(blocks)]


def backward_work(n, block=64):
    """Work of each K/V block x of a causal backward at Nq = Nk = n (64-row Q and K/V
    blocks): the Q blocks from its diagonal on."""
    blocks = -(-n // block)
    return [blocks - x for x in range(blocks)]


def launch_order(work, heads, order, chunk=1):
    """The works of every (block, head) in launch order. work: one head's blocks as ranked,
    heaviest first; order: "head by head" or "round the heads" (chunk blocks a head)."""
    if order == "head by head":
        return [w for _ in range(heads) for w in work]
    if order == "round the heads":
        return [w for c in range(0, len(work), chunk) for _ in range(heads)
                for w in work[c:c + chunk]]
    raise ValueError(f"unknown order {order!r}")


def makespan(works, slots):
    """When the last block ends if each starts, in order, on the first of `slots` to free."""
    free = [0.0] * slots
    for w in works:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


def past_even_share(works, slots):
    """makespan / (sum of work / slots) - 1: the fraction the grid's tail adds."""
    return makespan(works, slots) * slots / sum(works) - 1


def table(d=128, ns=(1024, 4096, 16384), sms=132, chunks=(1, 4)):
    """Rows (kernel, N, {order: fraction past the even share}) of the d = 128 (or 64) grid:
    the wide forward (128-row query blocks) and the backward (64-row blocks), one block an
    SM; at d = 64 the lean forward (64-row blocks, two an SM)."""
    rows = []
    for n in ns:
        heads = (16 * 1024 // n) * (2048 // d)
        kernels = ((("forward", forward_work(n), sms), ("backward", backward_work(n), sms))
                   if d > 64 else (("forward", forward_work(n, 64), 2 * sms),
                                   ("backward", backward_work(n), 2 * sms)))
        for name, work, slots in kernels:
            # the forward's work rises with x: heaviest first is the reversed list
            ranked = sorted(work, reverse=True)
            fractions = {"head by head": past_even_share(
                launch_order(ranked, heads, "head by head"), slots)}
            for chunk in chunks:
                fractions[f"round the heads, chunks of {chunk}"] = past_even_share(
                    launch_order(ranked, heads, "round the heads", chunk), slots)
            rows.append((name, n, fractions))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sms", type=int, default=132, help="SMs (H100 SXM, H200: 132)")
    ap.add_argument("--d", type=int, default=128, choices=(64, 128))
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    args = ap.parse_args(argv)
    for name, n, fractions in table(args.d, args.n, args.sms):
        cells = "  ".join(f"{order} {100 * x:5.1f} %" for order, x in fractions.items())
        print(f"d = {args.d} {name:8} N = {n:5}: past the even share: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
