"""On-disk cache of compiled kernels, shared across processes, never stale.

A kernel made with `cached_jit` (support.kernel_jit uses it) is compiled once per source
version and GPU architecture; a later process loads its cubin (LLVM, NVVM and ptxas are
skipped; numba-cuda stores the linked cubin per compute capability with the kernel).

Where: $NUMBA_FLASH_CACHE_DIR, else $XDG_CACHE_HOME/numba-flash, else ~/.cache/numba-flash,
then one folder per source fingerprint (below), then numba's own layout (one .nbi index and
.nbc data files per kernel function). NUMBA_FLASH_CACHE=0 turns it off (read when a kernel is
made, i.e. at a factory's first call); nothing is cached on the simulator. `clear()` removes
the cache folder; old fingerprints' folders are left for it.

Why not numba's `cache=True` as it is (numba-cuda 0.30.4, numba/cuda/core/caching.py):
- its freshness stamp is the mtime and size of the kernel's own file only, so an edit of a
  device function in another module (support.py, sm90/operands.py, ...) would be served stale;
- its index key hashes co_code (not co_consts: `x = 1.0` -> `x = 2.0` is the same key) and
  the pickled closure cells, and numba's @intrinsic objects pickle with a uuid4 made per
  process, so every kernel whose closure reaches an intrinsic (the fa2 vector path, all of
  sm90) would get a new key in every process: never a hit;
- the jit options (max_registers from kernel_jit(threads)) are not in the key at all.

So here (FlashCache, a numba-cuda CUDACache with its own locator and key):
- the source stamp is `fingerprint()`: a hash of every .py file under numba_flash/kernels/,
  reference/__init__.py and reference/precision.py (all the kernels import from the repo),
  the numba and numba-cuda versions, and, for a kernel defined outside the package, its own
  file's contents. Any edit of any of them is a miss. It is taken when this module is first
  imported (before the kernel modules are, so it describes the code this process runs); a
  kernel made after one of those files changed on disk is not cached (warned once);
- the key hashes a deterministic pickle of the kernel function *by value*: its code object
  (co_code and co_consts), the globals it names, its closure, recursively through device
  functions (CUDA dispatchers pickle as their py_func), with intrinsics as (name, definition)
  instead of their uuid, numba and llvmlite types as their names (their __dict__ holds a
  per-process type code and, after a compile, a cached string), and every function of this package or of a file outside the
  installed libraries by value too: the code in memory, not only the files on disk (the
  mutants of numba_flash.testing.mutants, built from edited source under the original file
  name, get keys of their own), plus the jit options and numba's (signature, GPU arch,
  numba-cuda version). A pickle that fails (an unpicklable global) disables the cache for
  that kernel; it still compiles.
- launch-config-sensitive kernels (none here) are not cached.
"""

import hashlib
import importlib.util
import os
import shutil
import sys
import sysconfig
import threading
import time
import warnings
from pathlib import Path

from numba import cuda

from .launch import SIMULATOR, Launcher

KERNELS_DIR = Path(__file__).resolve().parent
PACKAGE = "numba_flash"
REFERENCE_FILES = ("__init__.py", "precision.py")     # of the `reference` package


def enabled():
    """Whether kernels made now are cached: on a GPU, unless NUMBA_FLASH_CACHE=0 (or off/no/
    false)."""
    value = os.environ.get("NUMBA_FLASH_CACHE", "1").strip().lower()
    return not SIMULATOR and value not in ("0", "off", "no", "false")


def cache_root():
    """The cache folder: $NUMBA_FLASH_CACHE_DIR, $XDG_CACHE_HOME/numba-flash or
    ~/.cache/numba-flash."""
    if os.environ.get("NUMBA_FLASH_CACHE_DIR"):
        return Path(os.environ["NUMBA_FLASH_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "numba-flash"


def clear():
    """Remove the whole cache folder (every fingerprint's)."""
    shutil.rmtree(cache_root(), ignore_errors=True)


# ---------------------------------------------------------------- fingerprint of the sources

def source_files():
    """The files the package's kernels can depend on, sorted: every .py under kernels/ and the
    reference modules they import."""
    files = sorted(p for p in KERNELS_DIR.rglob("*.py") if "__pycache__" not in p.parts)
    spec = importlib.util.find_spec("reference")
    if spec is not None and spec.submodule_search_locations:
        ref = Path(list(spec.submodule_search_locations)[0])
        files += [ref / name for name in REFERENCE_FILES if (ref / name).exists()]
    return files


def _digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _versions():
    import numba
    import numba_cuda
    return f"numba {numba.__version__}; numba-cuda {numba_cuda.__version__}; " \
           f"python {sys.version_info[0]}.{sys.version_info[1]}"


def fingerprint(files=None, extra=()):
    """sha256 (hex) of the versions and of each file's name and contents: `files` (default
    source_files()) and `extra` (a user's kernel file)."""
    files = source_files() if files is None else files
    h = hashlib.sha256(_versions().encode())
    for path in list(files) + [Path(p) for p in extra]:
        path = Path(path)
        name = path.relative_to(KERNELS_DIR.parent.parent) if path.is_relative_to(
            KERNELS_DIR.parent.parent) else path
        h.update(f"\0{name}\0{_digest(path)}".encode())
    return h.hexdigest()


def _stats(files):
    out = {}
    for path in files:
        st = os.stat(path)
        out[str(Path(path).resolve())] = (st.st_mtime_ns, st.st_size)
    return out


# Taken at import (support.py imports this module before any kernel module is imported).
IMPORTED_AT_NS = time.time_ns()
_FILES = source_files()
_STATS = _stats(_FILES)
FINGERPRINT = fingerprint(_FILES)
_warned = set()
_lock = threading.Lock()


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def sources_unchanged():
    """True when the package's kernel sources on disk are as they were at import."""
    try:
        return _stats(_FILES) == _STATS and source_files() == _FILES
    except OSError:
        return False


def in_package(path):
    """True for a file of the fingerprinted sources (they need no file of their own)."""
    return str(Path(path).resolve()) in _STATS


def stamp_for(py_file):
    """The source stamp of a kernel in py_file: FINGERPRINT for the package's kernels, else a
    fingerprint that adds py_file's contents. None when py_file cannot be trusted to be the
    code this process runs (no such file, or changed after this module was imported)."""
    if in_package(py_file):
        return FINGERPRINT
    try:
        if os.stat(py_file).st_mtime_ns > IMPORTED_AT_NS:
            return None
        return fingerprint(_FILES, extra=[py_file])
    except OSError:
        return None


# ---------------------------------------------------------------------- counting, for tools

_counts = {"hits": 0, "misses": 0}


def stats():
    """{"hits": n, "misses": m}: disk-cache lookups of this process's cached kernels."""
    return dict(_counts)


# ------------------------------------------------------------ the jit helper and numba hooks

def cached_jit(fn=None, **options):
    """cuda.jit(**options) for a kernel, with the disk cache when enabled(); used bare
    (@cached_jit) or with options (@cached_jit(max_registers=...)). On a GPU the dispatcher
    comes in a launch.Launcher (kernel[grid, block, stream](*args) as before, with less host
    work and a thread-safe first load; its attributes are the dispatcher's); on the
    simulator exactly cuda.jit."""
    if fn is None:
        return lambda f: cached_jit(f, **options)
    dispatcher = cuda.jit(**options)(fn) if options else cuda.jit(fn)
    if SIMULATOR:
        return dispatcher
    if enabled():
        attach(dispatcher)
    return Launcher(dispatcher)


def attach(dispatcher):
    """Give a CUDA kernel dispatcher the disk cache (no-op when the sources changed since
    import or the kernel's file is not a trustworthy source). Returns whether it did."""
    py_func = dispatcher.py_func
    import inspect
    try:
        py_file = inspect.getfile(py_func)
    except TypeError:
        return False
    if not sources_unchanged():
        _warn_once("sources", "numba_flash kernel sources changed on disk since import: "
                   "kernels made from now on in this process are not cached on disk")
        return False
    stamp = stamp_for(py_file)
    if stamp is None:
        _warn_once(py_file, f"{py_file}: no file, or changed since numba_flash was imported; "
                   f"its kernels are not cached on disk in this process")
        return False
    try:
        dispatcher._cache = _classes()["FlashCache"](py_func, dict(dispatcher.targetoptions),
                                                     stamp)
    except Exception as e:          # no writable cache folder, or a numba-cuda that differs
        _warn_once(("attach", type(e)), f"numba_flash disk cache off: {e!r}")
        return False
    return True


def _intrinsic_key(*what):
    """Stands in for an @intrinsic or a type in the key's pickle (never called)."""
    raise RuntimeError("only for hashing")


def _installed_prefixes():
    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib",
                                                               "purelib", "platlib") if k in paths)


_built = {}


def _classes():
    """The numba-cuda subclasses, made on first use (numba-cuda's dispatcher is not imported
    on the simulator)."""
    with _lock:
        if _built:
            return _built
        import types

        import numba_cuda
        from numba.cuda.core.caching import _CacheLocator
        from numba.cuda.dispatcher import CUDACache, CUDACacheImpl
        from numba.cuda.extending import _Intrinsic
        from numba.cuda.serialize import NumbaPickler

        from llvmlite import ir
        from numba.core import types as core_types      # numba.cuda.types.Type is the same
        type_classes = (core_types.Type,)
        installed = _installed_prefixes()

        def by_value(func):
            module = getattr(func, "__module__", None) or ""
            if module.split(".")[0] in (PACKAGE, "reference"):
                return True
            filename = os.path.realpath(func.__code__.co_filename)
            if not os.path.exists(filename):
                return True          # <string>, <stdin>, a notebook cell: by value
            return not filename.startswith(installed)

        class KeyPickler(NumbaPickler):
            """NumbaPickler (cloudpickle) made deterministic for hashing: intrinsics without
            their per-process uuid, this package's and the user's functions by value."""

            def reducer_override(self, obj):
                if isinstance(obj, _Intrinsic):
                    return _intrinsic_key, (obj._name, obj._defn)
                # types by what they are: a numba type pickles its __dict__, which holds
                # _code (a per-process counter, in creation order) and an llvmlite type
                # caches its str() in its __dict__ once printed (after a compile)
                if isinstance(obj, type_classes):
                    return _intrinsic_key, (type(obj).__module__, type(obj).__qualname__,
                                            obj.name)
                if isinstance(obj, ir.Type):
                    return _intrinsic_key, ("llvmlite", type(obj).__qualname__, str(obj))
                if isinstance(obj, types.FunctionType) and by_value(obj):
                    return self._dynamic_function_reduce(obj)
                return super().reducer_override(obj)

        def function_digest(py_func, options):
            import io
            with io.BytesIO() as buf:
                KeyPickler(buf, protocol=4).dump((py_func, sorted(options.items())))
                return hashlib.sha256(buf.getvalue()).hexdigest()

        class FlashLocator(_CacheLocator):
            """Cache folder <root>/<fingerprint>/<file's folder, hashed>; stamp = fingerprint."""

            def __init__(self, py_func, py_file, stamp):
                self._py_file = py_file
                self._lineno = py_func.__code__.co_firstlineno
                self._stamp = stamp
                self._cache_path = str(cache_root() / stamp[:16]
                                       / self.get_suitable_cache_subpath(py_file))

            def get_cache_path(self):
                return self._cache_path

            def get_source_stamp(self):
                return self._stamp

            def get_disambiguator(self):
                return str(self._lineno)

            @classmethod
            def from_function(cls, py_func, py_file):
                stamp = getattr(py_func, "_numba_flash_stamp", None)
                if stamp is None:
                    return None                  # not ours (never consulted for others)
                self = cls(py_func, py_file, stamp)
                self.ensure_cache_path()         # OSError: attach turns the cache off
                return self

        class FlashCacheImpl(CUDACacheImpl):
            _locator_classes = [FlashLocator]

        class FlashCache(CUDACache):
            _impl_class = FlashCacheImpl

            def __init__(self, py_func, options, stamp):
                self._options = options
                self._digest = None
                py_func._numba_flash_stamp = stamp
                try:
                    super().__init__(py_func)
                finally:
                    del py_func._numba_flash_stamp

            # The index file of a function is shared by every key (d, causal, dtype...) and
            # numba rewrites it read-modify-write, unlocked: processes saving at once
            # (precompile.py's workers) could lose entries or point a key at another key's
            # data file, a wrong kernel loaded later without an error. One lock file per
            # index serializes loads and saves across processes.
            def _locked(self):
                import fcntl
                try:
                    f = open(self._cache_file._index_path + ".lock", "a")
                except OSError:                  # an unwritable folder: no lock (and numba's
                    return open(os.devnull, "a")  # own save fails and is reported as before)
                fcntl.flock(f, fcntl.LOCK_EX)
                return f

            def load_overload(self, sig, target_context):
                f = self._locked()
                try:
                    return super().load_overload(sig, target_context)
                finally:
                    f.close()                    # closing releases the lock

            def save_overload(self, sig, data):
                f = self._locked()
                try:
                    return super().save_overload(sig, data)
                finally:
                    f.close()

            def _function_digest(self):
                if self._digest is None:
                    try:
                        self._digest = function_digest(self._py_func, self._options)
                    except Exception as e:       # an unpicklable global: compile, don't cache
                        _warn_once(("key", self._name), f"not caching {self._name}: its key "
                                   f"could not be computed ({e!r})")
                        self.disable()
                        self._digest = "uncacheable"
                return self._digest

            def _index_key(self, sig, codegen):
                key = (sig, codegen.magic_tuple(), numba_cuda.__version__,
                       ("numba_flash", self._function_digest()))
                if self._launch_config_key is not None:
                    key += (("launch_config", self._launch_config_key),)
                return key

            def _load_overload(self, sig, target_context):
                if self._enabled:
                    self._function_digest()          # may disable
                data = super()._load_overload(sig, target_context)
                if self._enabled:
                    _counts["hits" if data is not None else "misses"] += 1
                return data

            # launch-config-sensitive kernels: not cached (numba-cuda then uses a NullCache)
            def is_launch_config_sensitive(self):
                return False

            def mark_launch_config_sensitive(self):
                return False

        _built.update(FlashCache=FlashCache, FlashLocator=FlashLocator,
                      function_digest=function_digest, KeyPickler=KeyPickler)
        return _built
