"""`numba-flash verify` on the simulator, at tiny sizes: what it checks by default (the pairs
kernel='auto' runs), --all, --kernel, --case, its summary and exit codes; and what its case
lists cover."""

import pytest

from numba_flash import cli, cuda_gpu_present, registry, verify
from numba_flash.testing import GPU_CASES, SIMULATOR_CASES, Case, mutants
from numba_flash.testing.campaign import plan

TINY = Case("tiny", 1, 1, 1, 3, 5, 3, causal=True)


def table(out):
    """(kernel, dtype, output, pass) of each row verify printed."""
    return [tuple(line.split()[:3]) + (line.split()[5],) for line in out.splitlines()
            if line.startswith(("fwd/", "bwd/"))]


def test_default_checks_what_auto_runs_in_every_dtype(capsys):
    assert verify.main(True, cases=[TINY], progress=True) == 0
    captured = capsys.readouterr()
    rows = table(captured.out)
    auto = {dt: registry.resolve("auto", TINY.d, dt).name
            for dt in ("float16", "bfloat16", "float32", "float64")}
    assert sorted(rows) == sorted((f"{stage}/{auto[dt]}", dt, out, "yes")
                                  for dt in auto
                                  for stage, outs in (("fwd", ("out", "lse")),
                                                      ("bwd", ("dq", "dk", "dv")))
                                  for out in outs)
    assert "what kernel='auto' runs here" in captured.out
    ran = {}                                    # pair -> the dtypes it ran (one pair or more)
    for dt, name in auto.items():
        ran.setdefault(name, []).append(dt)
    for name, dts in ran.items():
        assert (f"{name} (" + ", ".join(f"{dt} on 1 case" for dt in sorted(dts)) + ")"
                in captured.out), captured.out
    assert (f"1 case, {len(ran)} pair{'' if len(ran) == 1 else 's'}, 20 rows: all passed in"
            in captured.out)
    assert "pair" in captured.err                  # the progress bar, on stderr


def test_all_checks_every_registered_pair_once_per_case_and_dtype(capsys):
    assert verify.main(True, all_pairs=True, cases=[TINY]) == 0
    rows = table(capsys.readouterr().out)
    ran = {(kernel.split("/")[1], dt) for kernel, dt, _, _ in rows}
    expect = {(registry.resolve(name, TINY.d, dt).name, dt)
              for name in registry.PAIRS for dt in ("float16", "bfloat16", "float32", "float64")}
    assert ran == expect and {name for name, _ in ran} == set(registry.PAIRS)
    # a pair that falls back (wgmma in float64) is not checked twice
    assert len(rows) == 5 * len(expect)


def test_kernel_and_case_choose_the_rows(capsys):
    assert cli.main(["verify", "--kernel", "rowwise", "--case", "Nq != Nk", "--dtype",
                     "bfloat16", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    rows = table(out)
    assert {r[0] for r in rows} == {"fwd/rowwise", "bwd/rowwise"}
    assert {r[1] for r in rows} == {"bfloat16", "float64"} and len(rows) == 10
    assert all("Nq != Nk" in line for line in out.splitlines() if line.startswith("fwd/"))
    assert "1 case, 1 pair, 10 rows: all passed" in out


@pytest.mark.parametrize("flag", [False, True], ids=["atomic dQ", "--deterministic"])
def test_deterministic_flag_reaches_every_backward(flag, monkeypatch, capsys):
    """--deterministic runs every backward with deterministic=True (no dQ atomics), and the
    rows still pass; without it, none does."""
    from numba_flash.testing import campaign
    seen = []

    def backward(*args, **kwargs):
        seen.append(kwargs.get("deterministic"))
        return real(*args, **kwargs)

    real = campaign.flash_attention_backward
    monkeypatch.setattr(campaign, "flash_attention_backward", backward)
    argv = ["verify", "--kernel", "fa2", "--case", "Nq != Nk", "--dtype", "float32"]
    assert cli.main(argv + (["--deterministic"] if flag else [])) == 0
    out = capsys.readouterr().out
    assert seen == [flag] and "1 case, 1 pair, 5 rows: all passed" in out
    assert ("(deterministic=True)" in out) == flag


def test_a_failing_pair_exits_one():
    with mutants.registered("D left out of dS") as kernel:
        assert verify.main(True, kernels=[kernel], cases=[TINY], quiet=True) == 1


def test_usage_errors_exit_two(capsys):
    assert cli.main(["verify", "--kernel", "nope"]) == 2
    assert "unknown kernels ['nope']" in capsys.readouterr().err
    assert cli.main(["verify", "--case", "nope"]) == 2
    assert "unknown cases ['nope']" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["verify", "--all", "--kernel", "fa2"])
    assert e.value.code == 2


def test_default_plan_follows_auto_per_case_and_dtype():
    # on an H200 (sm_90): the Hopper pairs up to d = 128, wgmma in float32 and wgmma16 in the
    # half dtypes; fa2 past it and in float64
    steps = plan(GPU_CASES, device="sm_90")
    assert len(steps) == 4 * len(GPU_CASES)
    for st in steps:
        hopper = "wgmma" if st.dtype == "float32" else "wgmma16"
        want = hopper if st.dtype != "float64" and st.case.d <= 128 else "fa2"
        assert st.pairs == (want,), (st.case, st.dtype)
    # on an A100 (sm_80): mma16 in the half dtypes up to d = 128, else fa2
    for st in plan(GPU_CASES, device="sm_80"):
        half = st.dtype in ("float16", "bfloat16") and st.case.d <= 128
        assert st.pairs == ("mma16",) if half else ("fa2",), (st.case, st.dtype)
    # --kernel wgmma in float64 runs its fallback, and a name nothing runs is skipped
    st = plan([GPU_CASES[0]], ("float64",), ["wgmma", "fa2"], device="sm_90")[0]
    assert st.pairs == ("fa2",) and st.skipped == ()


@pytest.mark.parametrize("cases", [SIMULATOR_CASES, GPU_CASES], ids=["SIMULATOR_CASES", "GPU_CASES"])
def test_cases_cover_the_hard_shapes(cases):
    covered = {
        "odd shapes": any(c.Nq % 2 and c.Nk % 2 for c in cases),
        "Nq != Nk": any(c.Nq != c.Nk for c in cases),
        "causal": any(c.causal and c.Nq == c.Nk for c in cases),
        "causal Nq < Nk": any(c.causal and c.Nq < c.Nk for c in cases),
        "GQA": any(c.Hk < c.H for c in cases),
        "batch > 1": any(c.B > 1 for c in cases),
        "logits x1e3": any(c.logit_scale >= 1e3 for c in cases),
        "fully masked rows": any(c.causal and c.Nq > c.Nk for c in cases),
        "d not a multiple of 8": any(c.d % 8 for c in cases),
        "Nq = 1": any(c.Nq == 1 for c in cases),
    }
    assert all(covered.values()), [k for k, v in covered.items() if not v]


def test_precompile_runs_each_configuration_in_a_worker_and_reports_failures():
    # on the simulator the workers compile nothing, but run the same calls: a registered pair
    # is done, an unknown name comes back as its error, not raised
    from numba_flash.precompile import precompile
    done, failed = precompile([("fa2", 3, True, "float32"), ("fa2", 3, True, "float32"),
                               ("no such pair", 3, False, "float64")], processes=2)
    assert list(done) == [("fa2", 3, True, "float32")] and done[("fa2", 3, True, "float32")] > 0
    assert list(failed) == [("no such pair", 3, False, "float64")]
    assert "unknown kernel 'no such pair'" in failed[("no such pair", 3, False, "float64")]


def test_half_inputs_compile_ahead_as_the_kernels_they_run():
    # fa2 runs half inputs on its float32 kernels; wgmma has half kernels, one set for both
    assert verify._compiled_as("fa2", "bfloat16") == "float32"
    assert verify._compiled_as("fa2", "float64") == "float64"
    assert verify._compiled_as("wgmma", "bfloat16") == verify._compiled_as("wgmma", "float16")
    assert verify._compiled_as("wgmma", "float16") != verify._compiled_as("wgmma", "float32")
    # wgmma16's kernels are made for each half format
    assert verify._compiled_as("wgmma16", "bfloat16") == "bfloat16"
    assert verify._compiled_as("wgmma16", "float16") == "float16"


@pytest.mark.gpu
def test_gpu_verify_compiles_ahead_into_an_empty_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NUMBA_FLASH_CACHE_DIR", str(tmp_path / "cache"))
    assert verify.main(False, case_names=["causal", "d = 1"]) == 0
    out = capsys.readouterr().out
    # per case: wgmma float32, a 16-bit Hopper pair in bfloat16 and float16, fa2 float64
    assert "compiled ahead: 8 of 8 (pair, d, causal, dtype) configurations" in out, out
    assert any((tmp_path / "cache").rglob("*.nbi"))


@pytest.mark.skipif(cuda_gpu_present(), reason="the case of a machine without a GPU")
@pytest.mark.parametrize("argv", [["bench", "--quick"], ["tune"]], ids=["bench", "tune"])
def test_gpu_commands_refuse_without_a_gpu(argv, capsys):
    assert cli.main(argv) == 2                      # returned, not a SystemExit
    assert f"numba-flash {argv[0]} needs a CUDA GPU" in capsys.readouterr().err
