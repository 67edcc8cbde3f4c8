"""`numba-flash verify`'s kernel selection (the GPU run splits verify across processes with it)."""

from numba_flash import cli


def test_verify_checks_only_the_chosen_kernels(capsys):
    assert cli.main(["verify", "--forward", "rowwise", "--backward"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:-1]]
    assert rows and set(rows) == {"fwd/rowwise"}


def test_verify_rejects_unknown_or_no_kernels(capsys):
    assert cli.main(["verify", "--forward", "nope"]) == 2
    assert "unknown kernels ['forward nope']" in capsys.readouterr().err
    assert cli.main(["verify", "--forward", "--backward"]) == 2
    assert "no kernel chosen" in capsys.readouterr().err
