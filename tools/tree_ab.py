"""A/B of two commits of this repository on the GPU, each timed in a process of its own by
tools/gpu_time.py, with the table of --compare last: a kernel change of a few percent against
main in one device command.

    python tools/tree_ab.py pack BASE NEW            # here: git archive of both commits into
                                                     # .gpu/ab-base.tar and .gpu/ab-new.tar
    python tools/tree_ab.py pack main main --patch docs/patches/X.patch   # a prepared patch
    python tools/tree_ab.py run [--out DIR] -- ARGS  # on the device machine: each tree
                                                     # extracted, `gpu_time.py ARGS --json`
                                                     # run in it, then --compare

e.g. `pack main my-branch`, then the device tool's `run` with carry [".gpu", ".whl"] and
`... && python3 tools/tree_ab.py run -- --dtype float32 --kernel wgmma --peer efficient
--mode fwd --d 64`. Each tree imports its own numba_flash (its folder first on PYTHONPATH,
before the checkout the command runs in); the JSON files (ab-base.json, ab-new.json) and the
logs go to --out (default $OUT, else ./tree-ab). The peer is timed in both processes: its
drift between them is the A/B's noise floor (the --compare table shows it). Commit the change
first: git archive takes commits, not a working tree's edits.
"""

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile

NAMES = ("base", "new")


def pack(base, new, folder=".gpu", git=("git",), patch=None):
    """git archive of commits base and new into folder/ab-base.tar, folder/ab-new.tar; the
    paths. patch: a patch file (docs/patches/*.patch) applied to new's tree before it is
    packed (`git apply`; a CalledProcessError if it does not apply), so that a prepared patch
    is timed against its base without a branch."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for name, ref in zip(NAMES, (base, new)):
        path = os.path.join(folder, f"ab-{name}.tar")
        subprocess.run([*git, "archive", ref, "-o", path], check=True)
        if patch and name == "new":
            _apply_to_tar(path, os.path.abspath(patch))
        paths.append(path)
    return paths


def _apply_to_tar(path, patch):
    """Extract tar file `path`, `git apply` the patch file in it, and pack it again there."""
    with tempfile.TemporaryDirectory(prefix="tree-ab-patch-") as tree:
        with tarfile.open(path) as tar:
            tar.extractall(tree, filter="data")
        # --unsafe-paths is not needed: the patch's paths are inside the tree; outside a
        # repository git apply works on the plain files
        subprocess.run(["git", "apply", patch], cwd=tree, check=True)
        with tarfile.open(path, "w") as tar:
            for entry in sorted(os.listdir(tree)):
                tar.add(os.path.join(tree, entry), arcname=entry)


def run(gpu_time_args, out, folder=".gpu", call=subprocess.call):
    """Extract each packed tree into a temporary folder, run its tools/gpu_time.py with
    gpu_time_args and --json out/ab-NAME.json there (its log out/ab-NAME.log), then return
    the lines of `gpu_time.py --compare` of the two (or say which run failed: no --json
    file, one marked incomplete, or a nonzero exit with an unmarked file, from an older
    tree's gpu_time.py). A run that wrote every row and then exited nonzero (gpu_time.py has
    been seen to abort at exit) is used, a line before the table saying so."""
    os.makedirs(out, exist_ok=True)
    rest = os.environ.get("PYTHONPATH", "")
    results, notes = [], []
    for name in NAMES:
        tree = tempfile.mkdtemp(prefix=f"tree-ab-{name}-")
        with tarfile.open(os.path.join(folder, f"ab-{name}.tar")) as tar:
            tar.extractall(tree, filter="data")
        path = os.path.join(out, f"ab-{name}.json")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (tree, os.path.join(tree, "tools"), rest) if p))
        with open(os.path.join(out, f"ab-{name}.log"), "w") as log:
            status = call([sys.executable, os.path.join("tools", "gpu_time.py"),
                           *gpu_time_args, "--json", path], cwd=tree, env=env, stdout=log,
                          stderr=subprocess.STDOUT)
        complete = _complete(path)
        if complete is False:
            return [f"{name}: gpu_time.py exited {status} before writing every row "
                    f"(log: {log.name})"]
        if status and complete is None:
            return [f"{name}: gpu_time.py exited {status} (log: {log.name})"]
        if status:      # every row written, then a crash at exit (seen: glibc's "double free")
            notes.append(f"{name}: gpu_time.py exited {status} after writing every row "
                         f"(log: {log.name}); its rows are used")
        results.append(path)
    tools = os.path.dirname(os.path.abspath(__file__))
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import gpu_time       # (this checkout's: the --compare table)
    base, new = (json.load(open(p)) for p in results)
    return notes + gpu_time.compare(base, new)


def _complete(path):
    """Whether gpu_time.py's --json file at path holds every row: True or False as the file
    says, False where there is no readable file, None for a file without the mark (written by
    the gpu_time.py of a tree older than 2026-12-08: then the exit status decides)."""
    try:
        with open(path) as f:
            mark = json.load(f).get("complete")
    except (OSError, ValueError, AttributeError):
        return False
    return None if mark is None else mark is True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p_pack = sub.add_parser("pack", help="git archive BASE and NEW into --folder")
    p_pack.add_argument("base")
    p_pack.add_argument("new")
    p_pack.add_argument("--patch", help="a patch file applied to NEW's tree (git apply)")
    p_run = sub.add_parser("run", help="time both packed trees (on the GPU)")
    p_run.add_argument("--out", default=os.environ.get("OUT") or "tree-ab")
    for p in (p_pack, p_run):
        p.add_argument("--folder", default=".gpu", help="where the tar files are (default .gpu)")
    p_run.add_argument("gpu_time_args", nargs=argparse.REMAINDER,
                       help="after --: tools/gpu_time.py's arguments (not --json)")
    args = ap.parse_args(argv)
    if args.command == "pack":
        print("\n".join(pack(args.base, args.new, args.folder, patch=args.patch)))
        return 0
    gpu_args = [a for a in args.gpu_time_args if a != "--"]
    if "--json" in gpu_args or "--compare" in gpu_args:
        ap.error("run: tree_ab writes the --json files itself")
    lines = run(gpu_args, args.out, args.folder)
    print("\n".join(lines))
    failed = lines and ": gpu_time.py exited" in lines[0] and "rows are used" not in lines[0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
