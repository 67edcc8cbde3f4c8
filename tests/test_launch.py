"""kernels.launch: DeviceView, the launch key and packing, and Launcher on a GPU (first loads
under threads, packing as Numba packs, results)."""

import subprocess
import sys
import threading

import numpy as np
import pytest

from numba_flash.kernels.launch import DeviceView


def test_device_view_is_a_c_contiguous_array_of_its_memory():
    owner = object()
    v = DeviceView(4096, (2, 3, 8), np.float32, owner=owner)
    assert (v.ndim, v.size, v.nbytes, v.strides) == (3, 48, 192, (96, 32, 4))
    r = v.reshape(6, 8)
    assert (r.ptr, r.shape, r.dtype, r.owner) == (4096, (6, 8), np.float32, owner)
    assert v.reshape((48,)).shape == (48,)
    w = v.view(np.uint16)                   # the last axis scales with the item sizes
    assert (w.shape, w.strides) == ((2, 3, 16), (96, 32, 2))
    assert v.view(np.uint16).view(np.uint32).shape == (2, 3, 8)
    cai = v.__cuda_array_interface__
    assert (cai["shape"], cai["typestr"], cai["data"], cai["strides"], cai["stream"]) == \
        ((2, 3, 8), "<f4", (4096, False), None, None)
    with pytest.raises(ValueError, match="cannot reshape"):
        v.reshape(5, 8)
    with pytest.raises(ValueError, match="cannot view"):
        DeviceView(0, (3,), np.uint16).view(np.uint32)


def test_a_launch_takes_grid_block_and_stream_only():
    # the dynamic shared memory is the launcher's: a fourth value would be dropped silently
    from numba import cuda

    from numba_flash.kernels.launch import Launcher

    @cuda.jit
    def nothing(x):
        pass
    launcher = Launcher(nothing, nbytes=64)
    with pytest.raises(ValueError, match="launcher's, 64 bytes"):
        launcher[1, 1, 0, 128]
    with pytest.raises(ValueError, match="got 1 values"):
        launcher[(1,)]


# In a child without the simulator (numba.cuda imported first): numba's own typeof, no GPU
# needed. Equal launch keys must mean equal Numba types, else a launch would reuse a
# specialization compiled for other types.
KEYS = r"""
import json
import numpy as np
from numba import cuda
from numba.cuda.typing.typeof import Purpose, typeof
from numba_flash.kernels import launch
values = [0, 1, -5, -2**63 + 1, 2**31, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 1.5, -0.0,
          True, False,
          np.float32(1), np.float64(2), np.int32(3), np.int64(4), np.uint16(5), np.bool_(1),
          np.datetime64(1, "s"), np.datetime64(1, "ns"),
          launch.DeviceView(256, (2, 3, 4), np.float32),
          launch.DeviceView(256, (12,), np.float32),
          launch.DeviceView(512, (2, 3, 4), np.uint16), launch.DeviceView(0, (1, 1), np.float64)]
types_of = {}
for x in values:
    types_of.setdefault(repr(launch.arg_key(x)), set()).add(str(typeof(x, Purpose.argument)))
layouts = [typeof(v, Purpose.argument).layout for v in values if type(v) is launch.DeviceView]
print(json.dumps(dict(types={k: sorted(v) for k, v in types_of.items()}, layouts=layouts,
                      keys=len(types_of))))
"""


def test_equal_launch_keys_mean_equal_numba_types():
    import json
    out = subprocess.run([sys.executable, "-c", KEYS], capture_output=True, text=True,
                         timeout=300, env=_no_simulator_env())
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(len(t) == 1 for t in got["types"].values()), got["types"]
    assert set(got["layouts"]) == {"C"}
    # ints below 2**63 are int64 and 2**63.. uint64: keys apart
    assert got["types"][repr((int, 1))] == ["uint64"]
    assert got["types"][repr((int, 0))] == got["types"][repr((int, -1))] == ["int64"]


def _no_simulator_env():
    import os
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return env


@pytest.mark.gpu
def test_gpu_packing_matches_numbas_and_the_kernel_reads_it():
    # the arguments packed from DeviceViews are the ones Numba's own launch packs for the same
    # memory, and a kernel launched with them reads the arrays and scalars it was given
    from numba import cuda

    from numba_flash.kernels.launch import Launcher

    @cuda.jit
    def fill(out, src, x, n, flag):
        i = cuda.grid(1)
        if i < out.shape[0] * out.shape[1]:
            r, c = i // out.shape[1], i % out.shape[1]
            out[r, c] = src[r, c] * x + n + (1 if flag else 0)

    launcher = Launcher(fill)
    src_host = np.arange(40, dtype=np.float32).reshape(5, 8)
    out, src = cuda.device_array((5, 8), np.float32), cuda.to_device(src_host)
    views = [DeviceView(a.device_ctypes_pointer.value, a.shape, a.dtype, owner=a)
             for a in (out, src)]
    args = (*views, np.float32(0.5), 3, True)
    kern, _, packers = launcher.specialization(args)
    assert packers is not None
    ours, theirs = [], []
    for pack, a in zip(packers, args):
        pack(a, ours)
    for ty, a in zip(kern.argument_types, (out, src, *args[2:])):
        kern._prepare_args(ty, a, 0, [], theirs)

    def plain(v):
        return (type(v).__name__, v.value) if hasattr(v, "value") else v
    assert [plain(v) for v in ours] == [plain(v) for v in theirs]
    launcher[1, 64](*args)
    np.testing.assert_array_equal(out.copy_to_host(), src_host * 0.5 + 4)
    launcher[1, 64](out, src, np.float32(2), 0, False)     # Numba arrays: Numba's own packing
    np.testing.assert_array_equal(out.copy_to_host(), src_host * 2)


@pytest.mark.gpu
def test_gpu_first_launch_from_many_threads_loads_once():
    # numba-cuda loads a module on a kernel's first launch without a lock; eight threads
    # launching a fresh kernel at once registered one CUlibrary twice before the Launcher
    from numba import cuda

    from numba_flash.kernels.launch import Launcher

    @cuda.jit
    def add(out, i):
        out[i] += 1

    launcher = Launcher(add)
    out = cuda.to_device(np.zeros(8, np.int64))
    errors, start = [], threading.Barrier(8)

    def work(i):
        try:
            start.wait()
            launcher[1, 1](out, i)
        except Exception as e:
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    cuda.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), np.ones(8))
    assert len(launcher._compiled) == 1


def test_register_cap_fits_one_block_as_the_sm_allocates_registers():
    # registers per warp in units of 256, warps counted in fours (the SM's four partitions):
    # the cap times the block's threads, so rounded, fits in 65536 and the next unit does not
    from numba_flash.kernels.support import max_registers
    assert [max_registers(t) for t in (288, 320, 384, 512, 1024)] == [168, 168, 168, 128, 64]
    for threads in range(257, 1025, 32):
        warps = -(-threads // 32)
        quads = -(-warps // 4) * 4
        cap = max_registers(threads)
        assert cap % 8 == 0 and quads * cap * 32 <= 65536 < quads * (cap + 8) * 32


@pytest.mark.gpu
def test_gpu_torch_tensors_are_read_as_their_interface_describes_them():
    # arrays._torch_view reads a torch tensor without its __cuda_array_interface__: the same
    # pointer, dtype and (viewed) shape as the interface gives, and None (the interface's path,
    # with its errors) for tensors it does not take as they are
    torch = pytest.importorskip("torch")
    from numba_flash import arrays
    for dtype in (torch.float16, torch.float32, torch.float64, torch.int16):
        x = torch.arange(48, device="cuda").reshape(2, 3, 8).to(dtype)
        desc = x.__cuda_array_interface__
        view = arrays._torch_view(x, (6, 8), None)
        assert (view.ptr, view.shape, view.dtype) == (desc["data"][0], (6, 8),
                                                      np.dtype(desc["typestr"]))
        assert view.owner is x
        same = arrays._import(x, (6, 8), None, 0)
        assert (same.ptr, same.shape, same.dtype) == (view.ptr, view.shape, view.dtype)
    half = torch.zeros(4, 8, device="cuda", dtype=torch.float16)
    assert arrays._torch_view(half, (4, 8), np.uint16).dtype == np.uint16
    assert arrays._torch_view(half, (4, 8), np.float32) is None        # another item size
    assert arrays._torch_view(half, (8, 8), None) is None               # another size
    assert arrays._torch_view(half.t(), (8, 4), None) is None           # not contiguous
    assert arrays._torch_view(half.float().requires_grad_(), (4, 8), None) is None
    with pytest.raises(ValueError):
        arrays._import(half, (4, 8), np.float32, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,dtype", [("auto", "bfloat16"), ("auto", "float32"),
                                          ("wgmma16-tf32bwd", "bfloat16"), ("mma16", "float16"),
                                          ("fa2", "float32")])
def test_gpu_api_calls_on_torch_tensors_pack_every_launch_themselves(kernel, dtype):
    # an argument the Launcher cannot pack (a Numba device array: the TMA forward's tensor
    # maps were one until 2026-12-06) sends the launch through Numba's own, a few hundred us
    # of host a call: an API call on torch tensors makes no such launch, forward, backward,
    # deterministic or not (first calls, which compile and load, included)
    torch = pytest.importorskip("torch")
    from numba_flash import flash_attention_backward, flash_attention_forward
    from numba_flash.kernels.launch import Launcher
    q, k, v, do = (torch.randn(1, 2, 192, 64, device="cuda", dtype=getattr(torch, dtype))
                   for _ in range(4))
    before = Launcher.numba_launches
    for deterministic in (False, True):
        out, lse = flash_attention_forward(q, k, v, causal=True, kernel=kernel)
        flash_attention_backward(do, q, k, v, out, lse, causal=True, kernel=kernel,
                                 deterministic=deterministic)
    torch.cuda.synchronize()
    assert Launcher.numba_launches == before


def test_recording_lists_only_when_on():
    from numba_flash.kernels import launch
    with launch.recording(on=False) as events:
        launch.note("an allocation")
    assert events is None
    with launch.recording() as outer:
        launch.note(1)
        with launch.recording() as inner:
            launch.note(2)
        with launch.recording(on=False):
            launch.note(3)          # (off: the outer list goes on)
        launch.note(4)
    assert (outer, inner) == ([1, 3, 4], [2])
    launch.note(5)                  # outside any: nowhere
