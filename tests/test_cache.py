"""The kernels' disk cache (numba_flash/kernels/cache.py): the fingerprint and the key here
(CPU: real numba-cuda dispatchers are made in a child process without the simulator, none is
launched), the cache across processes on a GPU (`gpu`)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from numba_flash.kernels import cache

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "cache_times.py"


def _copy_sources(tmp_path):
    """A copy of numba_flash and reference to edit (the fingerprint's inputs)."""
    dst = tmp_path / "repo"
    for name in ("numba_flash", "reference"):
        shutil.copytree(ROOT / name, dst / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def test_fingerprint_covers_every_kernel_source_and_precision():
    files = cache.source_files()
    names = {p.relative_to(ROOT).as_posix() for p in files}
    kernels = {p.relative_to(ROOT).as_posix()
               for p in (ROOT / "numba_flash" / "kernels").rglob("*.py")}
    assert kernels <= names
    assert {"reference/precision.py", "reference/__init__.py",
            "numba_flash/kernels/support.py", "numba_flash/kernels/sm90/operands.py",
            "numba_flash/kernels/cache.py"} <= names


def test_kernels_import_nothing_of_the_repo_outside_the_fingerprint():
    # a kernel importing another repo module would make that module an unfingerprinted input
    import ast
    for path in (ROOT / "numba_flash" / "kernels").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                top = node.module.split(".")[0]
                if top == "numba_flash":
                    assert node.module.startswith("numba_flash.kernels"), (path, node.module)
                if top == "reference":
                    assert node.module == "reference.precision", (path, node.module)
            if isinstance(node, ast.ImportFrom) and node.level >= 2 and "sm90" not in path.parts:
                # numba_flash/arrays.py: host-side copies in run_backward, never compiled
                assert node.module is None and [a.name for a in node.names] == ["arrays"], \
                    (path, node.module)


def test_fingerprint_changes_with_any_source_file(tmp_path):
    repo = _copy_sources(tmp_path)
    files = sorted((repo / "numba_flash" / "kernels").rglob("*.py")) + \
        [repo / "reference" / "__init__.py", repo / "reference" / "precision.py"]
    before = cache.fingerprint(files)
    assert cache.fingerprint(files) == before                      # deterministic
    seen = {before}
    for path in (repo / "numba_flash/kernels/support.py",
                 repo / "numba_flash/kernels/sm90/operands.py",
                 repo / "reference/precision.py"):
        text = path.read_text()
        path.write_text(text + "\n# edited\n")
        changed = cache.fingerprint(files)
        assert changed not in seen, path
        seen.add(changed)
        path.write_text(text)
        assert cache.fingerprint(files) == before
    user = tmp_path / "my_kernel.py"
    user.write_text("x = 1\n")
    with_user = cache.fingerprint(files, extra=[user])
    user.write_text("x = 2\n")
    assert cache.fingerprint(files, extra=[user]) not in (with_user, before)


def test_cache_root_and_switch(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMBA_FLASH_CACHE_DIR", str(tmp_path / "c"))
    assert cache.cache_root() == tmp_path / "c"
    monkeypatch.delenv("NUMBA_FLASH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "xdg" / "numba-flash"
    if cache.SIMULATOR:
        assert not cache.enabled()                       # never on the simulator
    for off in ("0", "off", "false"):
        monkeypatch.setenv("NUMBA_FLASH_CACHE", off)
        assert not cache.enabled()


# A child without the simulator (numba.cuda imported before numba_flash): real dispatchers,
# made and keyed, none compiled or launched (no GPU needed).
CHILD = r"""
import json, os, sys, warnings
warnings.simplefilter("ignore")
from numba import cuda
import numpy as np
from numba_flash.kernels import cache, forward_fa2, forward_tiled, backward
from numba_flash.kernels.sm90 import backward as b90, forward as f90
fd = cache._classes()["function_digest"]
def kern(k):
    k = k[0] if isinstance(k, tuple) else k
    for a in ("kernel", "vector", "kernel"):
        k = getattr(k, a, k)
    return k
f32 = np.dtype(np.float32)
made = dict(
    fa2=forward_fa2.make_forward_kernel(64, 64, 64, True, f32),
    fa2_nc=forward_fa2.make_forward_kernel(64, 64, 64, False, f32),
    fa2_vec=forward_fa2.make_forward_kernel(64, 64, 128, False, f32, vector_loads=True),
    tiled=forward_tiled.make_forward_kernel(64, 32, 64, True, f32),
    tiled_f64=forward_tiled.make_forward_kernel(32, 16, 64, True, np.dtype(np.float64)),
    dq=backward.make_dq_kernel(32, 32, 64, True, f32),
    wgmma=f90.make_lean_kernel(False),
    wgmma_bwd=b90.make_lean_kernel(True, True, True))
out = {}
for name, k in made.items():
    k = kern(k)
    c = k._cache
    out[name] = dict(cache=type(c).__name__, digest=fd(k.py_func, k.targetoptions))
    if hasattr(c, "_impl"):
        out[name].update(path=c.cache_path, stamp=c._impl.locator.get_source_stamp())
print(json.dumps(dict(kernels=out, fingerprint=cache.FINGERPRINT)))
"""


def _child(tmp_path, seed, **env):
    env = dict(os.environ, PYTHONHASHSEED=str(seed), NUMBA_FLASH_CACHE_DIR=str(tmp_path / "c"),
               **env)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get(
        "PYTHONPATH")] if p])
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_keys_deterministic_across_processes_and_distinct(tmp_path):
    one, two = _child(tmp_path, 1), _child(tmp_path, 2)
    assert one == two                   # hash seeds differ: same keys, stamps, folders
    kernels = one["kernels"]
    assert {k["cache"] for k in kernels.values()} == {"FlashCache"}
    digests = [k["digest"] for k in kernels.values()]
    assert len(set(digests)) == len(digests)        # every configuration its own key
    for k in kernels.values():
        assert k["stamp"] == one["fingerprint"]
        assert Path(k["path"]).is_relative_to(tmp_path / "c" / one["fingerprint"][:16])


def test_switched_off_no_flash_cache(tmp_path):
    kernels = _child(tmp_path, 1, NUMBA_FLASH_CACHE="0")["kernels"]
    assert {k["cache"] for k in kernels.values()} == {"NullCache"}
    assert not (tmp_path / "c").exists()


# The key must not change when other kernels compile in the same process (numba types and
# llvmlite types gain state then): the wgmma backward's key did once the forward had
# compiled, a miss in every process (H200, 2026-12-03). Compiled to PTX for a stand-in sm_90
# device, as tools/ptxas_check.py does (needs NVVM and NVRTC, no GPU).
COMPILING_CHILD = r"""
import json, sys, types as pt, warnings
warnings.simplefilter("ignore")
from numba.cuda import dispatcher
dispatcher.get_current_device = lambda: pt.SimpleNamespace(compute_capability=(9, 0))
from numba import cuda, types
from numba_flash.kernels import cache
from numba_flash.kernels.sm90 import backward as b90, forward as f90
fd = cache._classes()["function_digest"]
def kern(k):
    k = k[0] if isinstance(k, tuple) else k
    for a in ("kernel", "vector", "kernel"):
        k = getattr(k, a, k)
    return k
forward = kern(f90.make_lean_kernel(False))
if sys.argv[1] == "compile":
    a3, a2 = types.Array(types.float32, 3, "C"), types.Array(types.float32, 2, "C")
    cuda.compile_ptx(forward.py_func, (a3, a3, a3, a3, a2, types.float32, types.int64,
                                       types.int64), cc=(9, 0))
backward = kern(b90.make_lean_kernel(False, True, True))
print(json.dumps([fd(k.py_func, k.targetoptions) for k in (forward, backward)]))
"""


def test_key_unchanged_by_compiling_other_kernels(tmp_path):
    env = dict(os.environ, NUMBA_FLASH_CACHE_DIR=str(tmp_path / "c"))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get(
        "PYTHONPATH")] if p])
    keys = []
    for mode in ("plain", "compile"):
        done = subprocess.run([sys.executable, "-c", COMPILING_CHILD, mode], env=env,
                              capture_output=True, text=True, timeout=600, cwd=ROOT)
        missing = [lib for lib in ("NVVM", "libnvvm", "libnvrtc") if lib in done.stderr]
        if done.returncode and missing:
            # the CUDA compiler libraries come with a CUDA toolkit or numba-cuda's cu12 / cu13
            # extras (a GPU machine has them; CI's plain install does not)
            pytest.skip(f"no CUDA compiler libraries here ({', '.join(missing)} not found)")
        assert done.returncode == 0, done.stderr[-3000:]
        keys.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert keys[0] == keys[1]


# ------------------------------------------------------------------------------- on a GPU

def _run(kernel, cache_dir, pythonpath, enabled=True):
    sys.path.insert(0, str(TOOL.parent))
    try:
        import cache_times
    finally:
        sys.path.pop(0)
    return cache_times.run_child(kernel, 64, 512, True, cache_dir, enabled=enabled,
                                 pythonpath=str(pythonpath))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["auto", "fa2"])
def test_second_process_loads_the_compiled_kernels(tmp_path, kernel):
    where = tmp_path / "cache"
    cold = _run(kernel, where, ROOT)
    warm = _run(kernel, where, ROOT)
    print(f"{kernel}: first process forward {cold['forward_s']:.2f} s backward "
          f"{cold['backward_s']:.2f} s; second {warm['forward_s']:.2f} s "
          f"{warm['backward_s']:.2f} s")
    assert cold["cache"]["hits"] == 0 and cold["cache"]["misses"] > 0
    assert warm["cache"] == {"hits": cold["cache"]["misses"], "misses": 0}
    assert any(where.rglob("*.nbc")) and any(where.rglob("*.nbi"))
    assert warm["out_bytes"] == cold["out_bytes"] and warm["dq"] == cold["dq"]
    assert warm["forward_s"] + warm["backward_s"] < 0.5 * (cold["forward_s"]
                                                           + cold["backward_s"])


@pytest.mark.gpu
def test_a_changed_support_source_is_a_miss(tmp_path):
    # kv_head (support.py, not the kernels' own files) maps query heads to key heads; the
    # edit sends every query head to key head 0, which changes the output of heads 1..3
    repo = _copy_sources(tmp_path)
    where = tmp_path / "cache"
    first = _run("fa2", where, repo)
    again = _run("fa2", where, repo)
    assert again["cache"]["misses"] == 0 and again["out_bytes"] == first["out_bytes"]
    support = repo / "numba_flash" / "kernels" / "support.py"
    text = support.read_text()
    old = "    return (bh // heads) * (heads // group) + (bh % heads) // group\n"
    assert text.count(old) == 1
    support.write_text(text.replace(old, "    return bh * 0\n"))
    edited = _run("fa2", where, repo)
    assert edited["fingerprint"] != first["fingerprint"]
    assert edited["cache"]["hits"] == 0 and edited["cache"]["misses"] > 0
    assert edited["out"] != first["out"]            # the edit is what ran
    support.write_text(text)                        # back: the first entries serve again
    back = _run("fa2", where, repo)
    assert back["cache"]["misses"] == 0 and back["out_bytes"] == first["out_bytes"]
