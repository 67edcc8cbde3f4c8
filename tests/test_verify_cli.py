"""`numba-flash verify`'s kernel selection (the GPU run splits verify across processes with it)."""

from numba_flash import cli


def test_verify_checks_only_the_chosen_kernels(capsys):
    assert cli.main(["verify", "--kernel", "rowwise"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:-1]]
    assert rows and set(rows) == {"fwd/rowwise", "bwd/rowwise"}


def test_verify_rejects_unknown_or_no_kernels(capsys):
    assert cli.main(["verify", "--kernel", "nope"]) == 2
    assert "unknown kernels ['nope']" in capsys.readouterr().err
