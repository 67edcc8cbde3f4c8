"""numba-cuda's CUDA simulator as numba_flash runs it (nothing here acts on a GPU).

The simulator runs a kernel one block at a time, one Python thread per CUDA thread, every line
interpreted. Each kernel's tests run there in CI, so what the simulator spends besides the
kernel's own arithmetic is what CI waits for. Patched here, once at import:

- **threads**: one pool of Python threads serves every block of every launch. numba-cuda made
  and started a thread per CUDA thread per block (on a simulated float32 wgmma forward, a
  sixth of the time the GIL was held, and each start a wait for the new thread);
- **turns**: a block's threads run one at a time, each until it stops (at a barrier, at its
  end, or in `yield_turn`), then the next ready one. When two ran at once (numba-cuda woke a
  whole block at a barrier; a chain of wakes here before 2026-12-06 kept two runnable), each
  NumPy call that let the GIL go handed it to the other: a wgmma16 backward property made
  1.16M context switches in 34 s, 12.7 s of it system time (`perf stat`), and took 18.7 s
  instead of 31.7 in turns. A barrier's sleepers join the ready queue in arrival order and
  reversed at alternate openings (`_Barrier.release`), so two threads run in both orders;
- **barriers**: a block's `syncthreads` and a warpgroup's barrier (`warpgroup_barrier`) are
  counts under one lock per block; numba-cuda's launching thread busy-polled every thread
  instead. A thread that would sleep at a barrier with no other thread ready raises (on a GPU
  the block would hang);
- **device functions**: numba-cuda swaps a module's `cuda` for the launch's fake one around
  every device-function call, under a lock per module (a generator context manager and two
  lock round trips a call: a quarter of a simulated wgmma kernel's own time). Here every
  module that holds a device function is swapped once, for the whole launch, and its calls go
  straight to the Python function;
- **scalar casts** (`float32(x)`) call NumPy's scalar type directly (`cast_scalars_directly`);
- **static shared arrays** are looked up under a lock (`lock_simulator_shared_arrays`);
- **floating-point warnings**: none from a kernel's NumPy arithmetic (a GPU raises no IEEE
  flags: a row that has seen no key computes -inf - -inf = NaN on purpose, non-finite inputs
  reach the products); a debug launch still raises on a division by zero;
- `thread_state()`: a simulated thread's own dict, empty at the start of each block (what the
  instruction models keep per thread: wgmma's exchange turns, wgmma16's products in flight).

A thread that raises ends its block: it passes no turn on; the launching thread wakes every
other thread, which raises where it sleeps (a thread yet to take its first turn skips the
kernel), waits until every thread of the block has finished and raises the first exception
(tid and ctaid in its message, as numba-cuda words it).
"""

import collections
import contextlib
import functools
import sys
import threading
import weakref

import numba
import numpy as np

from .launch import SIMULATOR

WARPGROUP_THREADS = 128     # threads of a warpgroup (sm90.wgmma.WARPGROUP)


def lock_simulator_shared_arrays():
    """Make the simulator's static shared arrays thread-safe (idempotent; nothing on a GPU).
    numba-cuda's FakeCUDAShared.array looks a static array up by the caller's (file, line) and
    creates it when missing, unlocked: two of a block's threads (Python threads) can both miss
    and each get an array of its own, so the block no longer shares its tile and the kernel
    computes garbage. Seen on a loaded 2-core machine (2026-12-02: the rowwise forward once
    returned lse of 1.6e7, passing when re-run alone; the tiled kernels failed three tests
    under a shorter switch interval, 2026-11-30). A lock around the lookup makes it a
    lookup again. Since a block's threads run in turns (run_blocks_on_a_thread_pool) two of
    them no longer look up at once; the lock stays as the safeguard it costs little to be."""
    if not SIMULATOR:
        return
    from numba.cuda.simulator import kernelapi
    shared = kernelapi.FakeCUDAShared
    if getattr(shared.array, "_locked", False):
        return
    unlocked, lock = shared.array, threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:    # dynamic memory (one buffer), or its error
            return unlocked(self, shape, dtype, alignment)
        if isinstance(dtype, numba.types.Type):
            dtype = numba.np.numpy_support.as_dtype(dtype)
        frame = sys._getframe(1)                   # the kernel's line, as the simulator keys it
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with lock:
            found = self._allocations.get(caller)
            if found is None:
                found = self._allocations[caller] = np.empty(shape, dtype)
        return found
    array._locked = True
    shared.array = array


class _Barrier:
    """Arrivals, live members and sleepers (threads) of one barrier (a block's or a
    warpgroup's), and how many times it has opened."""

    __slots__ = ("waiting", "alive", "sleepers", "openings")

    def __init__(self, alive):
        self.waiting, self.alive, self.sleepers, self.openings = 0, alive, [], 0

    def release(self, ready):
        """Open the barrier (under its block's lock): its sleepers join the block's `ready`
        queue (the thread that arrived last runs on first), in the order they arrived at
        every other opening and reversed at the rest, so that any two of them run in both
        orders within two openings: a read that a missing barrier leaves racing a write
        reads the stale value one way round or the other."""
        self.waiting = 0
        sleepers, self.sleepers = self.sleepers, []
        if self.openings % 2:
            sleepers.reverse()
        self.openings += 1
        ready.extend(sleepers)


@functools.lru_cache(maxsize=None)
def _block_layout(block_dim):
    """(threadIdx, linear id, warpgroup) of each thread of a block, in numba-cuda's order."""
    from numba.cuda.simulator.kernelapi import Dim3
    bx, by = block_dim[0], block_dim[1]
    layout = []
    for x, y, z in np.ndindex(*block_dim):
        linear = x + bx * (y + by * z)
        layout.append((Dim3(x, y, z), linear, linear // WARPGROUP_THREADS))
    return tuple(layout)


_CANNOT_OPEN = ("every live thread of the block waits at a barrier that cannot open (on a GPU "
                "the block would hang): threads wait at different barriers")


def run_blocks_on_a_thread_pool():
    """Replace numba-cuda's BlockManager.run (a block: make and start a thread per CUDA thread,
    busy-poll them) with the pool and barriers of this module's docstring (idempotent;
    nothing on a GPU)."""
    if not SIMULATOR:
        return
    from numba.cuda.simulator import kernel as simkernel
    from numba.cuda.simulator.kernelapi import Dim3
    manager = simkernel.BlockManager
    if getattr(manager.run, "_pooled", False):
        return
    pool = []

    class SimulatedThread(simkernel.BlockThread):
        """A pool thread: runs one CUDA thread of a block at a time, for any block, when its
        block's turn comes to it (`_go`). Keeps BlockThread's syncthreads_count / _and / _or
        (they use syncthreads below)."""

        def __init__(self, index):
            threading.Thread.__init__(self, name=f"simulated CUDA thread {index}", daemon=True)
            self._go = threading.Lock()
            self._go.acquire()
            self._manager = None
            self.exception, self.abort, self.debug, self.syncthreads_blocked = (
                None, False, False, False)

        def run(self):
            while True:
                self._go.acquire()
                m = self._manager
                self.state, self.exception = {}, None
                try:
                    if m._abort:                     # woken by an abort before its first turn
                        raise RuntimeError("abort flag set before the thread started")
                    # IEEE results without NumPy's floating-point warnings, as on a GPU
                    # (a row that has seen no key computes -inf - -inf = NaN on purpose);
                    # a debug launch raises on a division by zero, as BlockThread's wrapper
                    with np.errstate(all="ignore", divide="raise" if m._debug else "ignore"):
                        m._f(*m._args)
                except Exception as e:               # noqa: BLE001 - raised by the launch
                    tid, ctaid = f"tid={list(self.threadIdx)}", f"ctaid={list(self.blockIdx)}"
                    msg = f"{tid} {ctaid}" if str(e) == "" else f"{tid} {ctaid}: {e}"
                    self.exception = (type(e)(msg), sys.exc_info()[2])
                with m._lock:
                    if self.exception is not None and m._failed is None:
                        m._failed = self.exception
                    # the rest wait at a barrier this thread never met
                    for barrier in (m._block, m._groups[self._group]):
                        barrier.alive -= 1
                        if barrier.waiting and barrier.waiting == barrier.alive:
                            barrier.release(m._ready)
                    if not m._ready and m._block.alive and m._failed is None:
                        # the rest sleep at barriers that cannot open now (a GPU would hang)
                        m._failed = (RuntimeError(_CANNOT_OPEN), None)
                    if m._failed is None:
                        _pass_turn(m)
                    else:                            # the launching thread aborts the rest
                        m._done.notify_all()
                    if m._block.alive == 0:
                        m._done.notify_all()

        def syncthreads(self):
            _wait_at(self, self._manager._block)

        def warpgroup_sync(self):
            _wait_at(self, self._manager._groups[self._group])

    def _pass_turn(m):
        """Under m._lock, from the running thread as it stops (at a barrier, its end, a
        yield): the next ready thread of the block runs."""
        if m._ready:
            m._ready.popleft()._go.release()

    def _sleep(thread, m):
        """The calling thread (it has passed its turn on) waits for its next turn."""
        thread._go.acquire()
        if m._abort:
            raise RuntimeError("abort flag set on syncthreads clear")

    def _wait_at(thread, barrier):
        """`thread` at `barrier` (its block's or its warpgroup's) until all live members are:
        the last to arrive opens it and runs on; the others pass their turn on and sleep."""
        m = thread._manager
        with m._lock:
            if m._abort:
                raise RuntimeError("abort flag set on syncthreads call")
            if barrier.waiting + 1 == barrier.alive:
                barrier.release(m._ready)
                return
            if not m._ready:                # every other live thread sleeps at a barrier
                raise RuntimeError(_CANNOT_OPEN)
            barrier.waiting += 1
            barrier.sleepers.append(thread)
            _pass_turn(m)
        _sleep(thread, m)

    def yield_turn():
        """The calling simulated thread lets the block's other ready threads run before it
        goes on (a thread waiting for what another thread does, such as an mbarrier phase).
        False, at once, when no other thread is ready: none can run before it goes on."""
        thread = threading.current_thread()
        m = thread._manager
        with m._lock:
            if m._abort:
                raise RuntimeError("abort flag set on a wait")
            if not m._ready:
                return False
            m._ready.append(thread)
            _pass_turn(m)
        _sleep(thread, m)
        return True

    def run(self, grid_point, *args):
        layout = _block_layout(tuple(self._block_dim))
        while len(pool) < len(layout):
            pool.append(SimulatedThread(len(pool)))
            pool[-1].start()
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._args, self._failed, self._abort = args, None, False
        self._block = _Barrier(len(layout))  # before any starts: all take part in a barrier
        self._groups = {}
        block_idx = Dim3(*grid_point)
        threads = pool[:len(layout)]
        for t, (thread_idx, linear, group) in zip(threads, layout):
            t._manager, t.blockIdx, t.threadIdx, t.thread_id, t._group = (
                self, block_idx, thread_idx, linear, group)
            if group not in self._groups:
                self._groups[group] = _Barrier(0)
            self._groups[group].alive += 1
        # one thread runs at a time, in turns: the first now, the rest as each stops
        self._ready = collections.deque(threads[1:])
        threads[0]._go.release()
        with self._lock:
            while self._block.alive and self._failed is None:
                self._done.wait()
            failed = self._failed
            if failed is not None:
                self._abort = True          # every sleeper wakes and raises
                sleepers = [*self._ready, *self._block.sleepers,
                            *(t for g in self._groups.values() for t in g.sleepers)]
                self._ready.clear()
                for barrier in (self._block, *self._groups.values()):
                    barrier.sleepers = []
                for t in sleepers:
                    t._go.release()
                while self._block.alive:    # every thread back in the pool before it is reused
                    self._done.wait()
        if failed is not None:
            raise failed[0].with_traceback(failed[1])

    run._pooled = True
    manager.run = run
    global _yield_turn
    _yield_turn = yield_turn


_yield_turn = None


def yield_turn():
    """Inside a simulated kernel: let the block's other ready threads run before the calling
    thread goes on; False (at once) when none is ready. A thread that waits for what another
    of its block does, other than at a barrier (an mbarrier's phase), calls it in its wait:
    the block's threads run one at a time, each until it stops."""
    return _yield_turn()


def swap_device_modules_once_per_launch():
    """Calls of device functions inside a launch without numba-cuda's swap per call (see the
    module's docstring; idempotent; nothing on a GPU). Every module that holds a device
    function has its `cuda` swapped for the launch's fake module when the launch swaps the
    kernel's own, and back when it ends; a device function of a module so swapped is called
    directly. A module first seen during a launch (a device function made by a kernel) takes
    numba-cuda's path, as before."""
    if not SIMULATOR:
        return
    from numba.cuda.simulator import kernel as simkernel
    fake = simkernel.FakeCUDAKernel
    if getattr(fake.__call__, "_pinned", False):
        return
    init, call, swap = fake.__init__, fake.__call__, simkernel.swapped_cuda_module
    modules = {}        # id(module globals) -> weak reference to a device function of it
    pinned = {}         # id(module globals) -> the fake cuda module they hold in this launch

    def __init__(self, fn, device, *args, **kwargs):
        init(self, fn, device, *args, **kwargs)
        if device and hasattr(fn, "__globals__"):
            ref = modules.get(id(fn.__globals__))
            if ref is None or ref() is None:
                modules[id(fn.__globals__)] = weakref.ref(fn)

    def __call__(self, *args):
        context = simkernel._kernel_context
        if context is not None and pinned.get(id(self.fn.__globals__)) is context:
            return self.fn(*args)
        return call(self, *args)

    @contextlib.contextmanager
    def swapped_cuda_module(fn, fake_module):
        if pinned or fake_module is None or fake_module is not simkernel._kernel_context:
            with swap(fn, fake_module):     # a device call in a module not pinned
                yield
            return
        # the launch's own swap (FakeCUDAKernel.__call__ of a kernel): pin every module
        functions = [fn] + [f for f in (ref() for ref in list(modules.values())) if f]
        with contextlib.ExitStack() as stack:
            for f in functions:
                stack.enter_context(swap(f, fake_module))
                pinned[id(f.__globals__)] = fake_module
            try:
                yield
            finally:
                pinned.clear()

    __call__._pinned = True
    fake.__init__, fake.__call__ = __init__, __call__
    simkernel.swapped_cuda_module = swapped_cuda_module


def cast_scalars_directly():
    """numba's scalar types called on a value on the simulator (`float32(x)`, `uint32(i)`, in
    every kernel's inner loops) go straight to NumPy's scalar type, as Type.__call__ ends up
    doing after an import statement and a call of its own each time (a tenth of a simulated
    wgmma16 kernel's time). Called on types (a signature) they do what they did. Idempotent;
    nothing on a GPU."""
    if not SIMULATOR:
        return
    from numba.core import types
    for cls in (types.Integer, types.Float):
        if getattr(cls.__call__, "_direct", False):
            continue
        make_signature = cls.__call__

        def __call__(self, *args, _make_signature=make_signature):
            if len(args) == 1 and not isinstance(args[0], types.Type):
                return getattr(np, self.name)(args[0])      # cast_python_value
            return _make_signature(self, *args)
        __call__._direct = True
        cls.__call__ = __call__


def warpgroup_barrier():
    """The simulator's barrier of the calling thread's warpgroup (128 consecutive threads of
    its block, or the rest of them in the last): what a warpgroup-wide instruction (wgmma, a
    warp's shuffles and votes) orders on a GPU, which its model exchanges through shared
    memory. Every thread of the warpgroup calls it, and only those: a warpgroup that skips a
    product does not hold the others' exchanges up, as it does not on a GPU (a block barrier
    there let a causal kernel's stage-only warpgroups run steps ahead of the computing ones).
    Simulator only (there is nothing to call on a GPU)."""
    threading.current_thread().warpgroup_sync()


def thread_state():
    """The calling simulated thread's own dict, empty at the start of each block: state an
    instruction model keeps per CUDA thread (a pool thread runs many blocks' threads, so a
    threading.local would carry it from one block to the next). Simulator only."""
    return threading.current_thread().state


lock_simulator_shared_arrays()
run_blocks_on_a_thread_pool()
swap_device_modules_once_per_launch()
cast_scalars_directly()
