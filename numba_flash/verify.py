"""`numba-flash verify`: kernel pairs (forward, then its backward on that forward's out and
lse) over a fixed set of cases (testing.cases), in every dtype the API takes (float16,
bfloat16, float32, float64), against truth.

By default the pairs `flash_attention_forward`/`flash_attention_backward` run here with
kernel="auto" (registry.resolve per case and dtype: on an H200 with d <= 128 wgmma for
float32, wgmma16 for the half dtypes; on other sm_80+ GPUs mma16 for the half dtypes where it
fits; fa2 otherwise); `kernels=` names pairs, `all_pairs=True`
takes every registered one. Truth in
float64 (that of float32 kernels) is computed on the GPU when CuPy or torch can
(testing.truth), under the same tolerance rule (testing.tolerance). On a GPU with the disk
cache on, the plan's kernels are first compiled in parallel processes (precompile.py)."""

import sys
import time
import warnings

from . import registry
from .api import DTYPES
from .kernels import cache
from .precompile import precompile
from .testing import GPU_CASES, SIMULATOR_CASES
from .testing import truth as truth_mod
from .testing.campaign import plan, run_checks


def main(*args, **kwargs):
    """Print the table and a summary; return 0 when every row passes, 1 when one fails, 2 for
    a usage error. Arguments: _main's. Numba's low-occupancy warnings are not printed: the
    cases are small on purpose."""
    from numba.core.errors import NumbaPerformanceWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaPerformanceWarning)
        return _main(*args, **kwargs)


def _count(n, noun):
    """'1 case', '3 cases'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _main(simulator, quiet=False, kernels=None, all_pairs=False, case_names=None, cases=None,
         progress=None, dtypes=DTYPES, deterministic=False):
    """Print the table and a summary; return 0 when every row passes, 1 when one fails, 2 for
    a usage error (an unknown kernel or case name, nothing to run).

    kernels: names of registered pairs to check (default: what kernel="auto" runs);
    all_pairs: every registered pair instead. case_names: only the cases of these names;
    cases: the case list itself (default SIMULATOR_CASES on the simulator, else GPU_CASES).
    dtypes: the inputs' dtypes (default every one the API takes, api.DTYPES).
    deterministic: every backward with deterministic=True (the pairs that add dQ by atomics
    add it in a fixed order or in a dQ pass instead).
    progress: show a tqdm bar on stderr (default: when stderr is a terminal)."""
    from tqdm import tqdm
    if all_pairs and kernels:
        return _usage("--all and --kernel exclude each other")
    if all_pairs:
        kernels = sorted(registry.PAIRS)
    if kernels is not None:
        unknown = [n for n in kernels if n not in registry.PAIRS]
        if unknown or not kernels:
            return _usage(f"unknown kernels {unknown}; registered: {sorted(registry.PAIRS)}"
                          if unknown else "no kernel chosen")
    cases = list(cases if cases is not None else SIMULATOR_CASES if simulator else GPU_CASES)
    if case_names:
        unknown = [n for n in case_names if n not in {c.name for c in cases}]
        if unknown:
            return _usage(f"unknown cases {unknown}; cases: {[c.name for c in cases]}")
        cases = [c for c in cases if c.name in case_names]
    device = registry.current_device()
    dtypes = tuple(dtypes or DTYPES)
    if set(dtypes) - set(DTYPES):
        return _usage(f"unknown dtypes {sorted(set(dtypes) - set(DTYPES))}; the API takes {DTYPES}")
    steps = plan(cases, dtypes, kernels, device)
    total = sum(len(st.pairs) for st in steps)
    if not total:
        return _usage(f"no registered pair runs these cases on {device}")
    ns = truth_mod.namespace()
    where = ("the CUDA simulator (no GPU found), at small sizes" if simulator
             else f"the GPU ({device})")
    chosen = ("the default: what kernel='auto' runs here" if kernels is None
              else "every registered pair" if all_pairs else f"kernels {list(kernels)}")
    print(f"numba-flash verify: {_count(len(cases), 'case')} x {', '.join(dtypes)} on {where}; "
          f"{chosen}; forward, then its backward"
          f"{' (deterministic=True)' if deterministic else ''}; truth one precision up (float64 in "
          f"{ns.name}{' on the GPU' if ns.on_gpu else ''}, long double in numpy)")
    t0 = time.time()
    if not simulator and cache.enabled():
        compile_ahead(steps, progress)
    # rows name the part that ran, "fwd/" or "bwd/" and the pair's name
    width = max(13, 5 + max(len(name) for name in registry.PAIRS))
    print(f"{'kernel':<{width}} {'dtype':<8} {'out':<4} {'max err':>10} {'allowed':>10}  pass  case")
    failed = rows = 0
    ran = {}                     # pair -> {dtype: cases}
    bar = tqdm(total=total, unit="pair", file=sys.stderr, leave=False,
               disable=(not sys.stderr.isatty()) if progress is None else not progress)

    def step_done(st, pair):
        ran.setdefault(pair, {}).setdefault(st.dtype, set()).add(st.case.name)
        bar.update(1)
        bar.set_postfix_str(f"{pair} {st.dtype} {st.case.name}; {failed} failed")

    try:
        for row in run_checks(cases, ns=ns, on_step=step_done, steps=steps,
                              deterministic=deterministic):
            rows += 1
            failed += not row["ok"]
            if quiet and row["ok"]:
                continue
            tqdm.write(f"{row['kernel']:<{width}} {row['dtype']:<8} {row['output']:<4} "
                       f"{row['max_err']:>10.3e} {row['allowed']:>10.3e}  "
                       f"{'yes ' if row['ok'] else 'NO  '}  {row['case']}"
                       + (f"  ({row['note']})" if row["note"] else ""), file=sys.stdout)
    finally:
        bar.close()
    seconds = time.time() - t0
    print("checked: " + "; ".join(
        f"{pair} ({', '.join(dt + ' on ' + _count(len(c), 'case') for dt, c in sorted(by.items()))})"
        for pair, by in ran.items()))
    skipped = {}
    for st in steps:
        for name in st.skipped:
            skipped.setdefault(name, []).append(f"{st.case.name} ({st.dtype})")
    for name, where_not in skipped.items():
        print(f"not run: {name} cannot run on {device}: {', '.join(where_not)}")
    for name in sorted(set(kernels or ()) - set(ran) - set(skipped)):
        print(f"not run: {name} itself on any case here; what it falls back to ran instead")
    print(f"{_count(len(cases), 'case')}, {_count(len(ran), 'pair')}, {_count(rows, 'row')}: "
          f"{'all passed' if not failed else f'{failed} FAILED'} in {seconds:.0f} s")
    return 1 if failed else 0


def _compiled_as(pair, dtype):
    """The dtype whose kernels cover `pair` on `dtype` inputs. Half inputs run float32 kernels
    (registry.kernel_dtype): the float32 inputs' own for most pairs, compiled once; for a pair
    with half_inputs, kernels of their own, one set for both half formats (they differ only in
    the conversion kernels, which compile in the caller's process): compiled as float16; for
    a pair with half_storage, kernels of each half format."""
    if registry.PAIRS[pair].half_storage and registry.half_format(dtype):
        return dtype
    if registry.PAIRS[pair].half_inputs and registry.half_format(dtype):
        return "float16"
    return registry.kernel_dtype(dtype).name


def compile_ahead(steps, progress=False):
    """Compile every (pair, d, causal, dtype) of the plan (campaign.plan's steps) in parallel
    processes into the disk cache (precompile.py), so that run_checks loads them; print what
    it did. Call it only on a GPU with the cache on (cache.enabled())."""
    configs = {(pair, st.case.d, st.case.causal, _compiled_as(pair, st.dtype))
               for st in steps for pair in st.pairs}
    t0 = time.time()
    done, failed = precompile(configs, progress=sys.stderr.isatty() if progress is None
                              else progress)
    print(f"compiled ahead: {len(done)} of {len(configs)} (pair, d, causal, dtype) "
          f"configurations in {time.time() - t0:.0f} s, in parallel processes"
          + (f"; not: {len(failed)} (they compile in this process as they run), first: "
             f"{next(iter(failed.values()))}" if failed else ""))


def _usage(message):
    print(f"verify: {message}", file=sys.stderr)
    return 2
