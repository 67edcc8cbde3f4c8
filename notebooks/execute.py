"""Run the notebooks and write each one's .ipynb with its outputs (figures included).

    python notebooks/execute.py            # all eight
    python notebooks/execute.py 03 06      # those whose names start with 03 or 06

The jupytext script (NN_name.py) is the source: each is read, run top to bottom on the
python3 kernel with the notebooks folder as its working directory, and written as its paired
NN_name.ipynb. Without a GPU that is the CUDA simulator at the notebooks' small sizes, which is
what the committed notebooks show. `jupytext --sync notebooks/[0-9]*.py` pairs them again
without running anything (after editing either file); tests/test_notebooks.py checks that
each pair is in sync and that each notebook runs and its claim holds.
"""

import pathlib
import sys
import time

import jupytext
import nbclient

HERE = pathlib.Path(__file__).resolve().parent


def execute(script, timeout=1800):
    """Run jupytext script `script` and write its paired .ipynb; returns the notebook."""
    nb = jupytext.read(script)
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=timeout, record_timing=False,
                            resources={"metadata": {"path": str(HERE)}}).execute()
    jupytext.write(nb, script.with_suffix(".ipynb"))
    return nb


def main(prefixes):
    scripts = sorted(HERE.glob("[0-9][0-9]_*.py"))
    if prefixes:
        scripts = [s for s in scripts if s.name.startswith(tuple(prefixes))]
    for script in scripts:
        start = time.time()
        execute(script)
        print(f"{script.with_suffix('.ipynb').name}: {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
