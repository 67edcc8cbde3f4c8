"""What the notebooks share (notebooks/): figures shown inline in Jupyter or, run as plain
scripts (python notebooks/NN_name.py, from any folder), saved as PNG in a figures/ folder
beside the script; and notebooks/data found from wherever a notebook runs. Needs matplotlib
(the `notebooks` extra)."""

import pathlib
import sys

import matplotlib.pyplot as plt

import reference

plt.rcParams.update({"figure.dpi": 90, "savefig.dpi": 100})


def is_script():
    """True when run as a plain script (no Jupyter kernel, no interactive prompt)."""
    return "ipykernel" not in sys.modules and not hasattr(sys, "ps1")


def show(fig, name):
    """plt.show() in Jupyter; as a script, save fig as figures/<script>-<name>.png beside the
    script and close it."""
    if not is_script():
        return plt.show()
    script = pathlib.Path(sys.argv[0]).resolve()
    path = script.parent / "figures" / f"{script.stem}-{name}.png"
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    print("saved", path)


def data_file(name):
    """notebooks/data/<name>, looked for above the script's folder (as a script), the current
    folder and the checkout `reference` is imported from: a notebook runs from any folder."""
    starts = [pathlib.Path.cwd(), pathlib.Path(reference.__file__).resolve().parent]
    if is_script():
        starts.insert(0, pathlib.Path(sys.argv[0]).resolve().parent)
    for start in starts:
        for folder in (start, *start.parents):
            for path in (folder / "data" / name, folder / "notebooks" / "data" / name):
                if path.is_file():
                    return path
    raise FileNotFoundError(f"notebooks/data/{name} (install numba-flash from its checkout: "
                            "pip install -e '.[notebooks]')")
