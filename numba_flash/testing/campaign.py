"""Running the properties: one Hypothesis search per (property, kernel), used by the tests,
by `numba-flash fuzz` (a campaign that records every failure as a reproducer file) and by
`numba-flash replay`."""

import json
import os
import sys
import time

import numpy as np
from hypothesis import assume, given, settings, target

from ..api import flash_attention_backward, flash_attention_forward
from ..registry import PAIRS
from .cases import GPU_CASES, SIMULATOR_CASES
from .properties import PROPERTIES
from .strategies import Problem, problems
from .tolerance import check_backward, check_forward


def pairs(properties=None, kernels=None):
    """(property, kernel) for every property (of `properties`, default all) and every
    registered kernel it applies to (of `kernels`, default all)."""
    out = []
    for name in properties or PROPERTIES:
        out += [(name, k) for k in sorted(PAIRS)
                if (kernels is None or k in kernels) and applies(name, k)]
    return out


def applies(prop, kernel):
    """False for tile invariance on a pair of one tile shape (Pair.fixed_tiles, like wgmma),
    where there is no other tile to compare with."""
    return prop != "tile invariance" or not PAIRS[kernel].fixed_tiles


def search(prop, kernel, size, on_outcome=None, raise_on_failure=True, tiles="auto",
           should_stop=None, **settings_kw):
    """Run Hypothesis on one property for one kernel. Failing examples raise AssertionError
    (with the comparison report) unless raise_on_failure is False; every outcome is passed to
    on_outcome. tiles: draw tile sizes for "forward" or "backward" from what the kernel
    accepts (registry.tile_choices), or None for its defaults ("auto": as the property says).
    should_stop() -> True makes the remaining examples return without running (a deadline).
    settings_kw override the loaded profile (e.g. max_examples)."""
    from .. import registry
    func, kind, prop_tiles = PROPERTIES[prop]
    if tiles == "auto":
        tiles = prop_tiles
    # the dtypes the pair runs (a variant without a fallback, like a mutant of the float32
    # Hopper pair, raises for the others); the head dims too, case by case (assume)
    dtypes = tuple(dt for dt in ("float32", "float64") if registry.runs(kernel, 1, dt))

    @given(problems(size=size, dtypes=dtypes, tiles=(kernel, tiles) if tiles else None))
    def run(p):
        if should_stop is not None and should_stop():
            return                      # past the deadline: Problems are drawn lazily, cheap
        assume(registry.runs(kernel, p.d, p.dtype))
        outcome = func(kernel, p)
        assume(outcome is not None)
        target(min(outcome.worst, 1e6), label=f"{prop}: error / allowed")
        if on_outcome:
            on_outcome(outcome)
        if raise_on_failure:
            assert outcome.ok, outcome.report()

    if settings_kw:
        run = settings(**settings_kw)(run)
    run()


def run_checks(cases, dtypes=("float32", "float64"), kernels=None):
    """Yield one row per (kernel, dtype, case, output): dict with kernel, dtype, case,
    output, max_err, allowed, ok, note. kernels: registered pair names (default all)."""
    kernels = sorted(PAIRS) if kernels is None else kernels
    for case in cases:
        for dtype in dtypes:
            q, k, v, dout = case.inputs(dtype)
            for name in kernels:
                out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel=name)
                for c in check_forward(q, k, v, out, lse, causal=case.causal):
                    yield _row(f"fwd/{name}", dtype, case, c)
                grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                                 kernel=name)
                for c in check_backward(dout, q, k, v, *grads, causal=case.causal):
                    yield _row(f"bwd/{name}", dtype, case, c)


def _row(kernel, dtype, case, c):
    return dict(kernel=kernel, dtype=np.dtype(dtype).name, case=f"{case.name}: {case}",
                output=c.name, max_err=c.max_err, allowed=c.allowed, ok=c.ok, note=c.note)


def check_kernel(kernel, examples=10, size=None):
    """Every check on registered pair `kernel`: `numba-flash verify`'s cases (float32 and
    float64, forward and backward) and every property that applies to it, `examples` drawn
    examples each; AssertionError with the report on the first failure. size: a key of
    strategies.SIZES (default: "simulator" on the simulator, "gpu" on a GPU). Returns the
    number of verify rows and of properties checked."""
    from ..kernels.support import SIMULATOR
    size = size or ("simulator" if SIMULATOR else "gpu")
    rows = list(run_checks(SIMULATOR_CASES if size.startswith("simulator") else GPU_CASES,
                           kernels=[kernel]))
    failed = [r for r in rows if not r["ok"]]
    assert rows and not failed, "FAIL\n" + "\n".join(map(str, failed))
    todo = pairs(kernels=[kernel])
    for prop, name in todo:
        search(prop, name, size, max_examples=examples)
    return len(rows), len(todo)


def save_reproducer(outcome, directory):
    """Write the failing example (inputs + parameters + comparisons) to an .npz file."""
    os.makedirs(directory, exist_ok=True)
    p = outcome.problem
    slug = "".join(ch if ch.isalnum() else "-" for ch in f"{outcome.prop}-{outcome.kernel}")
    path = os.path.join(directory, f"{slug}-{p.seed}.npz")
    q, k, v, dout = p.inputs()
    meta = dict(prop=outcome.prop, kernel=outcome.kernel, problem=p.as_dict(),
                comparisons=[str(c) for c in outcome.comparisons])
    np.savez_compressed(path, q=q, k=k, v=v, dout=dout, meta=json.dumps(meta))
    return path


def load_reproducer(path):
    """(property name, kernel, Problem carrying the saved arrays) from a reproducer file."""
    with np.load(path) as f:
        meta = json.loads(str(f["meta"]))
        saved = tuple(f[n] for n in ("q", "k", "v", "dout"))
    return meta["prop"], meta["kernel"], Problem(**meta["problem"], saved=saved)


def fuzz(size, examples=None, seconds=None, directory="reproducers", progress=True,
         properties=None, kernels=None):
    """Run every (property, kernel) pair (of `properties` and `kernels`, default all, see
    pairs()): `examples` each, or
    batches of 10 round-robin until `seconds` have passed (checked before every example, so a
    slow example overruns by itself only). Returns (outcomes, failures, reproducer paths)."""
    from tqdm import tqdm
    todo = pairs(properties, kernels)
    outcomes, failures, paths = [], [], []
    bar = tqdm(total=(examples or 0) * len(todo) or None, disable=not progress, unit="example")

    def record(outcome):
        outcomes.append(outcome)
        bar.update(1)
        bar.set_postfix_str(f"{outcome.prop} [{outcome.kernel}] failures {len(failures)}")
        if not outcome.ok:
            failures.append(outcome)
            paths.append(save_reproducer(outcome, directory))
            # at once, not only in the final summary: a campaign cut short by a time limit
            # (a GPU run) still leaves every failure it found in its log
            bar.write(f"FAILED {outcome.report()}\n  reproducer: {paths[-1]}", file=sys.stderr)

    start = time.time()

    def past_deadline():
        return bool(seconds) and time.time() - start > seconds

    while True:
        for prop, kernel in todo:
            search(prop, kernel, size, on_outcome=record, raise_on_failure=False,
                   max_examples=examples or 10, should_stop=past_deadline)
            if past_deadline():
                break
        if not seconds or past_deadline():
            break
    bar.close()
    return outcomes, failures, paths
