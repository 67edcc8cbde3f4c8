"""Every notebook runs, top to bottom, and its last cell checks its claim: a notebook that
stops being true fails here. On the simulator they run at small sizes, on a GPU at real ones."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))


def test_there_are_seven_notebooks():
    assert len(NOTEBOOKS) == 7, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_its_claim_holds(path):
    env = dict(os.environ, MPLBACKEND="Agg")
    run = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "claim holds" in run.stdout
