"""Running the properties: one Hypothesis search per (property, kernel), used by the tests,
by `numba-flash fuzz` (a campaign that records every failure as a reproducer file) and by
`numba-flash replay`."""

import hashlib
import itertools
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from hypothesis import Verbosity, assume, given, settings, target

from ..api import DTYPES, flash_attention_backward, flash_attention_forward
from ..registry import PAIRS
from .cases import GPU_CASES, SIMULATOR_CASES, Case
from .properties import PROPERTIES
from .strategies import REGIMES, Problem, problems
from .tolerance import backward_truth, check_backward, check_forward, forward_truth


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
           should_stop=None, dtypes=DTYPES, regimes=REGIMES, **settings_kw):
    """Run Hypothesis on one property for one kernel. Failing examples raise AssertionError
    (with the comparison report) unless raise_on_failure is False; every outcome is passed to
    on_outcome. tiles: draw tile sizes for "forward" or "backward" from what the kernel
    accepts (registry.tile_choices), or None for its defaults ("auto": as the property says).
    should_stop() -> True, asked before each example runs, ends the search there (a deadline;
    the examples run so far stand; such a search reports nothing itself, Verbosity.quiet:
    Hypothesis would take the stop for an error and print a seed to reproduce it).
    dtypes: the input dtypes to draw from (default every one the API takes; of those, the
    ones the pair runs itself, else the ones it runs through its fallback). regimes: the
    logit regimes to draw from (strategies.REGIMES). settings_kw override the loaded profile
    (max_examples)."""
    from .. import registry
    func, kind, prop_tiles = PROPERTIES[prop]
    if tiles == "auto":
        tiles = prop_tiles
    # the dtypes the pair runs itself, where it runs any here (a dtype it hands to its
    # fallback is the fallback's search: wgmma16 drew float32 and float64 too, and ran
    # wgmma's and fa2's kernels on them), else those it runs through a fallback (a variant
    # without one, like a mutant of the float32 Hopper pair, raises for the others); the head
    # dims case by case (assume)
    pair = registry.PAIRS.get(kernel)         # (None for "auto", which resolves case by case)
    dtypes = (tuple(dt for dt in dtypes if pair is not None and registry.runs_itself(
                  pair, 1, dt, registry.current_device()))
              or tuple(dt for dt in dtypes if registry.runs(kernel, 1, dt)))
    if not dtypes:
        raise ValueError(f"kernel {kernel!r} runs none of the dtypes asked for")

    @given(problems(size=size, dtypes=dtypes, regimes=regimes,
                    tiles=(kernel, tiles) if tiles else None))
    def run(p):
        if should_stop is not None and should_stop():
            raise _Stop                 # not an Exception: Hypothesis lets it through at once
        assume(registry.runs(kernel, p.d, p.dtype))
        outcome = func(kernel, p)
        assume(outcome is not None)
        target(min(outcome.worst, 1e6), label=f"{prop}: error / allowed")
        if on_outcome:
            on_outcome(outcome)
        if raise_on_failure:
            assert outcome.ok, outcome.report()

    if should_stop is not None:
        settings_kw.setdefault("verbosity", Verbosity.quiet)
    if settings_kw:
        run = settings(**settings_kw)(run)
    try:
        run()
    except _Stop:
        pass


class _Stop(BaseException):
    """Raised inside a search to end it (search's should_stop): like KeyboardInterrupt,
    Hypothesis neither counts it as a failure nor shrinks it, and re-raises it."""


@dataclass(frozen=True)
class Step:
    """One (case, dtype) of a verify plan: the pairs that run it (registered names, after
    resolution and without repeats) and the asked names that no pair runs here."""
    case: Case
    dtype: str
    pairs: tuple
    skipped: tuple = ()


def plan(cases, dtypes=DTYPES, kernels=None, device=None):
    """The Steps `run_checks` takes: for each case and dtype, the pair each name of `kernels`
    resolves to on `device` (registry.resolve; default this process's), "auto" (the default,
    kernels=None) being what flash_attention_forward/backward run by default. A name that
    falls back (wgmma -> fa2 in float64) runs as its fallback, once however many names lead
    there; one that nothing runs for that case is listed in Step.skipped."""
    from .. import registry
    kernels = ["auto"] if kernels is None else list(kernels)
    device = device or registry.current_device()
    steps = []
    for case in cases:
        for dtype in dtypes:
            pairs, skipped = [], []
            for name in kernels:
                if not registry.runs(name, case.d, dtype, device):
                    skipped.append(name)
                    continue
                ran = registry.resolve(name, case.d, dtype, device).name
                if ran not in pairs:
                    pairs.append(ran)
            steps.append(Step(case, np.dtype(dtype).name, tuple(pairs), tuple(skipped)))
    return steps


def case_truth(case, dtype, ns=None):
    """(inputs, ForwardTruth, BackwardTruth) of `case` in `dtype`: what every pair's rows on it
    are compared with (float64 truth in truth.Namespace `ns`; default NumPy)."""
    q, k, v, dout = inputs = case.inputs(dtype)
    return (inputs, forward_truth(q, k, v, causal=case.causal, ns=ns),
            backward_truth(dout, q, k, v, causal=case.causal, ns=ns))


def run_checks(cases, dtypes=DTYPES, kernels=None, ns=None, on_step=None,
               steps=None, deterministic=False):
    """Yield one row per (pair, dtype, case, output): dict with kernel ("fwd/NAME" or
    "bwd/NAME", NAME the pair that ran), pair, dtype, case, output, max_err, allowed, ok, note.
    Each pair runs its forward, then its backward on that forward's out and lse.
    kernels: registered names or "auto" (default ["auto"]: what the API runs by default);
    see plan(), or pass its `steps`. Truth is computed once per (case, dtype) for all pairs,
    ahead, by a few threads (NumPy's long double loops and BLAS let go of the GIL), in
    truth.Namespace `ns` (default NumPy). on_step(step, pair) is called after each pair.
    deterministic: the backwards run with deterministic=True (the pairs that add dQ by
    atomics run their dQ pass instead)."""
    steps = plan(cases, dtypes, kernels) if steps is None else steps
    pool = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)))
    try:
        truths = [pool.submit(case_truth, st.case, st.dtype, ns) if st.pairs else None
                  for st in steps]
        for st, future in zip(steps, truths):
            if future is None:
                continue
            (q, k, v, dout), f_truth, b_truth = future.result()
            case = st.case
            for name in st.pairs:
                out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel=name)
                for c in check_forward(q, k, v, out, lse, causal=case.causal, truth=f_truth):
                    yield _row("fwd", name, st.dtype, case, c)
                grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                                 kernel=name, deterministic=deterministic)
                for c in check_backward(dout, q, k, v, *grads, causal=case.causal,
                                        truth=b_truth):
                    yield _row("bwd", name, st.dtype, case, c)
                if on_step is not None:
                    on_step(st, name)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _row(stage, pair, dtype, case, c):
    return dict(kernel=f"{stage}/{pair}", pair=pair, dtype=np.dtype(dtype).name,
                case=f"{case.name}: {case}", output=c.name, max_err=c.max_err,
                allowed=c.allowed, ok=c.ok, note=c.note)


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
    """Write the failing example (inputs + parameters + comparisons) to a new .npz file in
    `directory`, named after the property, the kernel, the problem's seed and a hash of the
    whole problem, with -2, -3, ... where that name is taken (the same problem may fail more
    than once): an existing file is never overwritten. Returns its path."""
    os.makedirs(directory, exist_ok=True)
    p = outcome.problem
    slug = "".join(ch if ch.isalnum() else "-" for ch in f"{outcome.prop}-{outcome.kernel}")
    digest = hashlib.sha1(json.dumps(p.as_dict(), sort_keys=True, default=str).encode())
    stem = os.path.join(directory, f"{slug}-{p.seed}-{digest.hexdigest()[:8]}")
    q, k, v, dout = p.inputs()
    meta = dict(prop=outcome.prop, kernel=outcome.kernel, problem=p.as_dict(),
                comparisons=[str(c) for c in outcome.comparisons])
    for n in itertools.count(1):
        path = f"{stem}.npz" if n == 1 else f"{stem}-{n}.npz"
        try:
            f = open(path, "xb")        # exclusive: fails where the file exists
        except FileExistsError:
            continue
        with f:
            np.savez_compressed(f, q=q, k=k, v=v, dout=dout, meta=json.dumps(meta))
        return path


def load_reproducer(path):
    """(property name, kernel, Problem carrying the saved arrays) from a reproducer file."""
    with np.load(path) as f:
        meta = json.loads(str(f["meta"]))
        saved = tuple(f[n] for n in ("q", "k", "v", "dout"))
    # np.savez keeps ml_dtypes' bfloat16 as raw 2-byte voids ('V2'): the bits are right, the
    # dtype is lost, so view them back as the dtype the problem names
    dtype = np.dtype(meta["problem"]["dtype"])
    saved = tuple(a.view(dtype) if a.dtype.kind == "V" else a for a in saved)
    return meta["prop"], meta["kernel"], Problem(**meta["problem"], saved=saved)


def _progress_bar(tqdm, examples, seconds, progress):
    """fuzz's bar on stderr: over the examples, or over the seconds of a timed campaign. In a
    log (stderr not a terminal) it redraws every 30 s, not ten times a second."""
    interactive = sys.stderr.isatty()
    common = dict(disable=not progress, file=sys.stderr, mininterval=0.1 if interactive else 30,
                  maxinterval=10 if interactive else 60)
    if examples:
        return tqdm(total=examples, unit="example", **common)
    return tqdm(total=float(seconds), unit="s", **common,   # "01:40 of 15:00" (mm:ss)
                bar_format="{l_bar}{bar}| {elapsed} of " + tqdm.format_interval(seconds)
                + "{postfix}")


def fuzz(size, examples=None, seconds=None, directory="reproducers", progress=True,
         properties=None, kernels=None, dtypes=DTYPES):
    """Run every (property, kernel) pair (of `properties` and `kernels`, default all, see
    pairs()), one Hypothesis search each: `examples` examples each, or, with `seconds`, for
    a share of the time: each pair in turn until its deadline, the time left over the pairs
    left (so a pair that ends early, or overruns by one slow example, leaves the others their
    share). Each pair runs until it has one outcome whatever the clock says (Hypothesis starts
    with its simplest problem, a cheap one), so every pair is tried. Every failure is saved at
    once as a reproducer (save_reproducer). dtypes: as search's. Returns (outcomes,
    failures, reproducer paths);
    tally(outcomes, pairs(...)) counts them per pair."""
    from tqdm import tqdm
    if not examples and not seconds:
        raise ValueError("fuzz needs examples or seconds")
    todo = pairs(properties, kernels)
    outcomes, failures, paths = [], [], []
    start = time.time()
    bar = _progress_bar(tqdm, examples * len(todo) if examples else None, seconds, progress)
    got = {}                            # pair -> outcomes so far

    def record(outcome):
        outcomes.append(outcome)
        key = (outcome.prop, outcome.kernel)
        got[key] = got.get(key, 0) + 1
        # examples counted, or (with seconds) the time spent, capped at the bar's end
        bar.update(1 if examples else min(time.time() - start, bar.total) - bar.n)
        bar.set_postfix_str(f"{len(outcomes)} examples, {len(failures)} failed; "
                            f"{outcome.prop} [{outcome.kernel}]", refresh=False)
        if not outcome.ok:
            failures.append(outcome)
            paths.append(save_reproducer(outcome, directory))
            # at once, not only in the final summary: a campaign cut short by a time limit
            # (a GPU run) still leaves every failure it found in its log
            bar.write(f"FAILED {outcome.report()}\n  reproducer: {paths[-1]}", file=sys.stderr)

    end = time.time() + (seconds or 0)
    for i, (prop, kernel) in enumerate(todo):
        stop = None
        if seconds:
            deadline = time.time() + max(0.0, end - time.time()) / (len(todo) - i)
            tried = [0]

            def stop(key=(prop, kernel), deadline=deadline, tried=tried):
                tried[0] += 1
                # past the deadline: stop once the pair has an outcome, or has tried 20
                # examples without one (problems the property does not apply to)
                return time.time() > deadline and (got.get(key, 0) > 0 or tried[0] > 20)
        search(prop, kernel, size, on_outcome=record, raise_on_failure=False,
               max_examples=examples or 10 ** 6, should_stop=stop, dtypes=dtypes)
    if not examples:        # the time spent in all (the last pair ends past its deadline)
        bar.update(min(time.time() - start, bar.total) - bar.n)
    bar.close()
    return outcomes, failures, paths


def tally(outcomes, todo):
    """[(property, kernel, examples, failures, worst error / allowed)] for each pair of
    `todo` (pairs()), in its order, counting `outcomes` (fuzz's)."""
    rows = {pair: [0, 0, 0.0] for pair in todo}
    for o in outcomes:
        row = rows.setdefault((o.prop, o.kernel), [0, 0, 0.0])
        row[0] += 1
        row[1] += not o.ok
        row[2] = max(row[2], o.worst)
    return [(prop, kernel, *row) for (prop, kernel), row in rows.items()]
