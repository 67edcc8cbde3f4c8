"""Nsight Compute's per-instruction page of one kernel, summed into a few lines: where the warps'
stall samples sit by reason, by instruction, and by phase (the stretches between block barriers,
in program order), and which shared-memory accesses replay (bank conflicts).

    ncu --set full --import-source no -o rep ...          # on the GPU, then:
    ncu --import rep.ncu-rep --page source --csv --print-source sass > sass.csv
    python tools/ncu_source.py sass.csv [--top 12] [--min-share 0.01]

The csv of a Hopper backward is ~1.6 MB, over what a device run brings back; this summary is a
few KB (run it on the device). Figures are shares of all the kernel's stall samples ("Warp
Stall Sampling (All Samples)": a warp sampled at an instruction, issuing or not) and of its
executed warp instructions. A phase starts after a BAR (bar.sync) and ends at the next, so a
kernel's per-Q-block steps (S, P, dV, dK, dQ ...) come out as separate rows; the row's ops say
which step it is.
"""

import argparse
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
EXCESSIVE, WAVEFRONTS = "L1 Wavefronts Shared Excessive", "L1 Wavefronts Shared"
# ops named in a phase's row, when it has any
MARKED = ("HGMMA", "MUFU", "LDG", "STG", "LDS", "STS", "RED", "ATOM", "LDGSTS", "SYNCS", "UTMALDG")


def op_of(source):
    """The opcode of a SASS line, predicate and modifiers left out ("@!P0 LDS.64 R2, [R4]" ->
    "LDS")."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def read(path):
    """[(kernel name, header, rows)] of an ncu source-page csv (one block per kernel: a "Kernel
    Name" line, the header, one row per instruction)."""
    kernels, name, header, rows = [], None, None, []
    with open(path, newline="") as f:
        for line in csv.reader(f):
            if not line:
                continue
            if line[0] == "Kernel Name":
                if header is not None:
                    kernels.append((name, header, rows))
                name, header, rows = line[1] if len(line) > 1 else "", None, []
            elif header is None:
                header = line
            else:
                rows.append(line)
    if header is not None:
        kernels.append((name, header, rows))
    return kernels


def _number(text):
    try:
        return float(text.replace(",", "")) if text else 0.0
    except ValueError:
        return 0.0


def _top(why, samples, n=2):
    """"reason share, ..." of the n reasons with most of `samples` in {stall column: samples}."""
    return ", ".join(f"{r[len('stall_'):]} {v / samples:.2f}" for r, v in
                     sorted(why.items(), key=lambda x: -x[1])[:n] if samples and v)


def summarize(header, rows, top=12, min_share=0.01):
    """The summary's lines (list of str) of one kernel's rows."""
    col = {h: i for i, h in enumerate(header)}
    if SAMPLES not in col or "Source" not in col:
        raise ValueError(f"not an ncu source page (--page source --csv): no {SAMPLES!r} column")
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    insts = [dict(op=op_of(r[col["Source"]]), source=r[col["Source"]].strip(),
                  address=r[col["Address"]] if "Address" in col else "",
                  samples=_number(r[col[SAMPLES]]),
                  executed=_number(r[col[EXECUTED]]) if EXECUTED in col else 0.0,
                  stalls={s: _number(r[col[s]]) for s in stalls},
                  excessive=_number(r[col[EXCESSIVE]]) if EXCESSIVE in col else 0.0,
                  wavefronts=_number(r[col[WAVEFRONTS]]) if WAVEFRONTS in col else 0.0)
             for r in rows if len(r) == len(header)]
    total = sum(i["samples"] for i in insts) or 1.0
    executed = sum(i["executed"] for i in insts) or 1.0
    out = [f"{len(insts)} instructions, {total:.0f} stall samples, {executed:.0f} warp "
           f"instructions executed"]
    # by reason
    reasons = {s: sum(i["stalls"][s] for i in insts) / total for s in stalls}
    out.append("stall reasons (share of samples): " + ", ".join(
        f"{s[len('stall_'):]} {v:.2f}" for s, v in sorted(reasons.items(), key=lambda x: -x[1])
        if v >= min_share))
    # by op
    by_op = {}
    for i in insts:
        o = by_op.setdefault(i["op"], [0.0, 0.0, 0, dict.fromkeys(stalls, 0.0)])
        o[0] += i["samples"]
        o[1] += i["executed"]
        o[2] += 1
        for r in stalls:
            o[3][r] += i["stalls"][r]
    out.append(f"by op (top {top}): op, share of samples, of executed, static count, its top "
               f"stalls")
    for op, (s, e, n, why) in sorted(by_op.items(), key=lambda x: -x[1][0])[:top]:
        out.append(f"  {op:<10} {s / total:6.3f} {e / executed:6.3f} {n:5d}  [{_top(why, s)}]")
    # by phase: split after each BAR
    phases, current = [], []
    for i in insts:
        current.append(i)
        if i["op"] == "BAR":
            phases.append(current)
            current = []
    if current:
        phases.append(current)
    out.append(f"by phase ({len(phases)} stretches ending at a BAR; those with >= {min_share} of "
               f"samples): first address, samples, executed, top stalls, ops")
    for k, ph in enumerate(phases):
        s = sum(i["samples"] for i in ph)
        if s / total < min_share:
            continue
        e = sum(i["executed"] for i in ph)
        tops = _top({r: sum(i["stalls"][r] for i in ph) for r in stalls}, s, 3)
        ops = {}
        for i in ph:
            if i["op"] in MARKED:
                ops[i["op"]] = ops.get(i["op"], 0) + 1
        marks = " ".join(f"{op} {n}" for op, n in sorted(ops.items()))
        out.append(f"  {k:3d} {ph[0]['address']:>14} {s / total:6.3f} {e / executed:6.3f}  "
                   f"[{tops}]  {marks}")
    # shared-memory replays
    shared = {}
    for i in insts:
        if i["wavefronts"]:
            x = shared.setdefault(i["op"], [0.0, 0.0])
            x[0] += i["excessive"]
            x[1] += i["wavefronts"]
    if shared:
        out.append("shared memory, excessive / all wavefronts (bank conflicts): " + ", ".join(
            f"{op} {x[0] / x[1]:.2f} of {x[1]:.0f}" for op, x in sorted(shared.items())))
    return out


def short_name(name):
    """A kernel's name without its mangled arguments: "...::dkdv_wgmma_wide"."""
    base = re.split(r"\[abi:|\(", name, maxsplit=1)[0]
    return base.split("::")[-1] or name[:80]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=12, help="ops listed (by samples)")
    parser.add_argument("--min-share", type=float, default=0.01,
                        help="leave out stall reasons and phases below this share of samples")
    args = parser.parse_args(argv)
    kernels = read(args.csv)
    if not kernels:
        print(f"{args.csv}: no kernel in it", file=sys.stderr)
        return 1
    for name, header, rows in kernels:
        print(f"== {short_name(name)}")
        print("\n".join(summarize(header, rows, args.top, args.min_share)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
