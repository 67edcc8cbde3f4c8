"""The fuzz campaign records failures as reproducer files, and replay re-runs them."""

import ml_dtypes
import numpy as np

from numba_flash import cli
from numba_flash.registry import PAIRS
from numba_flash.testing import Comparison, Outcome, campaign, mutants
from numba_flash.testing.properties import PROPERTIES


def test_fuzz_saves_reproducers_that_replay_fails(tmp_path, capsys):
    with mutants.registered("D left out of dS") as kernel:
        outcomes, failures, paths = campaign.fuzz(
            "simulator", examples=2, directory=str(tmp_path), progress=False,
            properties=["backward agrees"], kernels=[kernel, "tiled"])
        assert {o.kernel for o in outcomes} == {kernel, "tiled"}   # the selection, no other
        assert kernel in PAIRS
        assert failures and all(f.kernel == kernel for f in failures)
        assert len(paths) == len(failures) and all(p.endswith(".npz") for p in paths)
        assert capsys.readouterr().err.count("FAILED backward agrees") == len(failures)
        prop, name, problem = campaign.load_reproducer(paths[0])
        assert (prop, name) == ("backward agrees", kernel)
        assert problem.saved is not None and problem.saved[0].shape[2] == problem.Nq
        assert cli.main(["replay", paths[0]]) == 1          # still failing: exit 1
    capsys.readouterr()
    # the mutant's pair is gone: a clear refusal (2), not a traceback or a "still fails" (1)
    assert cli.main(["replay", paths[0]]) == 2
    assert "not registered in this process" in capsys.readouterr().err
    assert cli.main(["replay", str(tmp_path / "missing.npz")]) == 2
    assert "cannot read a reproducer" in capsys.readouterr().err
    (tmp_path / "not.npz").write_bytes(b"not a reproducer")
    assert cli.main(["replay", str(tmp_path / "not.npz")]) == 2
    np.save(tmp_path / "array.npy", np.zeros(3))             # an array, not a reproducer
    assert cli.main(["replay", str(tmp_path / "array.npy")]) == 2


def test_fuzz_cli_exits_zero_when_nothing_fails(tmp_path, capsys):
    rc = cli.main(["fuzz", "--profile", "ci", "--examples", "1", "--out", str(tmp_path),
                   "--property", "D = rowsum(P * dP)"])
    out = capsys.readouterr().out
    assert rc == 0 and "0 failed" in out and "Worst error / allowed" in out
    assert not list(tmp_path.iterdir())


def test_fuzz_draws_only_the_dtypes_asked_for(tmp_path):
    outcomes, failures, _ = campaign.fuzz("simulator", 3, None, tmp_path, progress=False,
                                          properties=["forward agrees"], kernels=["rowwise"],
                                          dtypes=("bfloat16",))
    assert len(outcomes) == 3 and not failures
    assert {o.problem.dtype for o in outcomes} == {"bfloat16"}


CHEAP = dict(properties=["D = rowsum(P * dP)", "forward agrees"], kernels=["rowwise", "tiled"])


def test_fuzz_stops_at_its_deadline(tmp_path):
    # a deadline already past: each pair still gets its first example, and no more (on the
    # H200 a batch of ten slow examples once ran 25 s past --seconds, when the deadline was
    # checked between batches only)
    outcomes, failures, paths = campaign.fuzz("simulator", seconds=1e-9, directory=str(tmp_path),
                                              progress=False, **CHEAP)
    assert sorted((o.prop, o.kernel) for o in outcomes) == sorted(campaign.pairs(**CHEAP))
    assert failures == [] and paths == []


def test_fuzz_seconds_are_shared_by_every_pair(tmp_path, capsys):
    # 4 pairs in 3 s: each must get examples (when the pairs ran in order, batches of ten,
    # 60 s reached 5 of 34 pairs and no backward property)
    rc = cli.main(["fuzz", "--profile", "ci", "--seconds", "3", "--out", str(tmp_path)]
                  + [a for p in CHEAP["properties"] for a in ("--property", p)]
                  + [a for k in CHEAP["kernels"] for a in ("--kernel", k)])
    captured = capsys.readouterr()
    out = captured.out
    assert rc == 0 and "3 s shared among them" in out
    # the bar runs over the seconds; in a log (stderr not a terminal) it is drawn at its
    # start and end (every 30 s between), not once an example
    draws = [d for d in captured.err.replace("\r", "\n").splitlines() if "of 00:03" in d]
    assert 2 <= len(draws) <= 3, captured.err
    assert "100%" in draws[-1] and "0 failed" in draws[-1], draws
    counts = {}
    for line in out.splitlines():
        for prop, kernel in campaign.pairs(**CHEAP):
            if line.startswith(prop) and line.split()[len(prop.split())] == kernel:
                counts[prop, kernel] = int(line.split()[len(prop.split()) + 1])
    assert len(counts) == 4 and all(n >= 1 for n in counts.values()), out


def always_fails(kernel, p):
    """A stub property: every problem fails, with no kernel run."""
    return Outcome("always fails", kernel, p, [Comparison("out", 1.0, 1.0, 0.5, False)])


def test_every_failure_gets_its_own_reproducer(tmp_path, monkeypatch):
    monkeypatch.setitem(PROPERTIES, "always fails", (always_fails, "forward", None))
    outcomes, failures, paths = campaign.fuzz("simulator", examples=6, directory=str(tmp_path),
                                              progress=False, properties=["always fails"],
                                              kernels=["rowwise"])
    assert len(failures) == len(outcomes) >= 6
    assert len(set(paths)) == len(paths) == len(failures) == len(list(tmp_path.iterdir()))
    # the same failing problem twice: two files, the first left as it was
    first = open(paths[0], "rb").read()
    again = campaign.save_reproducer(failures[0], str(tmp_path))
    assert again not in paths and open(paths[0], "rb").read() == first
    assert campaign.load_reproducer(again)[2].as_dict() == failures[0].problem.as_dict()


def test_bfloat16_reproducers_replay_in_bfloat16(tmp_path, monkeypatch):
    monkeypatch.setitem(PROPERTIES, "always fails", (always_fails, "forward", None))
    _, failures, paths = campaign.fuzz("simulator", examples=1, directory=str(tmp_path),
                                       progress=False, properties=["always fails"],
                                       kernels=["rowwise"], dtypes=("bfloat16",))
    _, _, problem = campaign.load_reproducer(paths[0])
    for saved, drawn in zip(problem.inputs(), failures[0].problem.inputs()):
        assert saved.dtype == drawn.dtype == ml_dtypes.bfloat16
        assert np.array_equal(saved.view(np.uint16), drawn.view(np.uint16))


def test_fuzz_cli_rejects_unknown_kernels_and_empty_selections(capsys):
    assert cli.main(["fuzz", "--profile", "ci", "--examples", "1", "--kernel", "nope"]) == 2
    assert "unknown kernels ['nope']" in capsys.readouterr().err
    # a forward-only property asked of a backward-only kernel name matches no pair
    assert campaign.pairs(["forward agrees"], ["no such kernel"]) == []
    # tile invariance only where there are tiles to draw (wgmma has one shape)
    assert ("tile invariance", "fa2") in campaign.pairs()
    assert ("tile invariance", "wgmma") not in campaign.pairs()
    assert ("forward agrees", "wgmma") in campaign.pairs()


def test_gpu_profile_does_not_shrink():
    from hypothesis import Phase, settings

    from conftest import PROFILE
    from numba_flash.testing import profiles
    try:
        profiles.load("gpu")
        assert Phase.shrink not in settings.default.phases
        assert Phase.generate in settings.default.phases
    finally:
        profiles.load(PROFILE)          # back to the session's profile
