"""The notebooks: each NN_name.ipynb (committed with its outputs) is paired with its jupytext
script NN_name.py, and the pair must agree cell for cell; each notebook runs top to bottom from
a folder that is not the repository's, and its last cell checks its claim (a notebook that
stops being true fails here). On the simulator they run at small sizes, on a GPU at real ones.
"""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

# the test extra installs them (CI); a GPU machine without them runs the rest of the suite
jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
from jupyter_client.manager import KernelManager

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
# the notebooks that run no kernel (plots of recorded data and NumPy models): cheap enough to
# run a second time as plain scripts, which must save their figures
PLOTS_ONLY = ("01_memory_wall", "02_softmax", "06_performance", "07_tensor_cores", "08_training")


def test_there_are_eight_notebooks():
    assert len(NOTEBOOKS) == 8, NOTEBOOKS
    assert sorted(p.with_suffix(".ipynb") for p in NOTEBOOKS) == sorted(
        (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def cells(nb):
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


@pytest.mark.parametrize("script", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_and_script_are_in_sync(script):
    notebook = script.with_suffix(".ipynb")
    assert notebook.is_file(), f"{notebook.name} is missing: run python notebooks/execute.py {script.stem[:2]}"
    text, ipynb = jupytext.read(script), jupytext.read(notebook)
    assert ipynb.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent"
    assert cells(text) == cells(ipynb), (
        f"{script.name} and {notebook.name} differ: run `jupytext --sync notebooks/*.py` (then "
        f"`python notebooks/execute.py {script.stem[:2]}` for its outputs)")
    code = [c for c in ipynb.cells if c.cell_type == "code"]
    assert all(c.outputs for c in code[-1:]), f"{notebook.name} has no outputs: run python notebooks/execute.py"


def test_every_notebook_opens_with_its_claim_and_ends_checking_it():
    for script in NOTEBOOKS:
        nb = jupytext.read(script)
        assert nb.cells[0].cell_type == "markdown" and "**Claim" in nb.cells[0].source, script.name
        last = nb.cells[-1]
        assert last.cell_type == "code" and "assert" in last.source, script.name
        assert last.source.rstrip().endswith('print("claim holds")'), script.name


@pytest.mark.parametrize("script", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_from_any_folder_and_its_claim_holds(script, tmp_path):
    nb = nbformat.read(script.with_suffix(".ipynb"), as_version=4)
    # the kernel starts in tmp_path, away from the repository (as a notebook opened elsewhere)
    # IPC sockets in tmp_path, not TCP ports: two xdist workers starting kernels at once can
    # both be handed the same free port, and one kernel dies before replying (seen once)
    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(tmp_path / "kernel"))
    nbclient.NotebookClient(nb, km=km, timeout=900, record_timing=False,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    printed = "".join(o.get("text", "") for o in last.outputs if o.output_type == "stream")
    assert "claim holds" in printed, printed


@pytest.mark.parametrize("name", PLOTS_ONLY)
def test_as_a_script_it_saves_its_figures(name, tmp_path):
    # a copy of the script in a folder of its own, run from another: its figures go to
    # figures/ beside the script
    script = shutil.copy(ROOT / "notebooks" / f"{name}.py", tmp_path)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    run = subprocess.run([sys.executable, script], cwd=cwd, env=dict(os.environ, MPLBACKEND="Agg"),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "claim holds" in run.stdout
    figures = sorted((tmp_path / "figures").glob(f"{name}-*.png"))
    assert figures and all(f.stat().st_size > 1000 for f in figures), figures
