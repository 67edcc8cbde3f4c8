"""Reading cuobjdump's SASS listing of one kernel: its instructions, op counts, and where its
main loop is, so that what a block does once (before and after the loop) can be told from what
it does every step. Static counts: every instruction once, whatever runs it how often.

    python tools/ptxas_check.py --sass --sections forward16 "d=64 bfloat16 causal=False vector"

(tools/ptxas_check.py compiles the kernels and calls these; this module only parses text.)
"""

import re

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
# BRA's target, also behind modifiers and a second predicate operand (`@P1 BRA !P3, 0x4e20`:
# the lean float32 forward's main loop closes so; missed before 2026-12-07)
_BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(?:!?U?P[\dT]+\s*,\s*)?(?:0x)?([0-9a-f]+)\b")
TENSOR_OPS = ("HGMMA", "HMMA")


def instructions(text):
    """[(address, op, text)] of a SASS listing, NOPs left out; op without its predicate and
    modifiers (e.g. "HGMMA", "LDS")."""
    out = []
    for m in _LINE.finditer(text):
        body = m.group(2)
        op = re.sub(r"^@!?U?P\w+\s+", "", body).split()[0].split(".")[0]
        if op != "NOP":
            out.append((int(m.group(1), 16), op, body))
    return out


def sections(text):
    """Static instruction counts of a kernel's SASS: {"before", "loop", "after", "subroutines",
    "loop_tensor_ops", "calls"}. The loop is the backward branch's range holding the most
    tensor-core instructions (the longest if none has any); "after" runs to the last EXIT,
    "subroutines" (64-bit division, slow paths) lie past it; "calls" counts CALL sites."""
    ins = instructions(text)
    if not ins:
        raise ValueError("no SASS instructions in the text")
    exits = [a for a, op, _ in ins if op == "EXIT"]
    last = max(exits) if exits else ins[-1][0]
    loops = []
    for address, op, body in ins:
        m = _BRANCH.search(body) if op == "BRA" else None
        # (a branch past the last EXIT back into the kernel is an out-of-line retry, e.g. an
        # mbarrier wait's, spanning all before it: not a loop of the kernel)
        if m and int(m.group(1), 16) < address <= last:
            start = int(m.group(1), 16)
            body_ops = [o for a, o, _ in ins if start <= a <= address]
            loops.append((sum(o in TENSOR_OPS for o in body_ops), len(body_ops), start,
                          address))
    tensor, _, lo, hi = max(loops) if loops else (0, 0, None, None)
    count = {"before": 0, "loop": 0, "after": 0, "subroutines": 0}
    for address, op, _ in ins:
        if address > last:
            count["subroutines"] += 1
        elif lo is None or address < lo:
            count["before"] += 1
        elif address <= hi:
            count["loop"] += 1
        else:
            count["after"] += 1
    count["loop_tensor_ops"] = tensor
    count["calls"] = sum(op == "CALL" for _, op, _ in ins)
    return count
