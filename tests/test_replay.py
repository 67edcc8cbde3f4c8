"""numba_flash.replay: which calls a forward plan is made of, and on a GPU that a replayed
forward gives what the full call gives, skips the work the plan stands for, and serves only
calls that match the remembered one."""

import ctypes
import weakref

import numpy as np
import pytest

from numba_flash import registry, replay
from numba_flash.kernels.launch import VIEW_PTR, DeviceView, Launch, _pack_view


def _fake_launch(args):
    """A Launch record of args as Launcher.launch packs them (views by _pack_view, scalars
    as themselves)."""
    packed, starts = [], []
    for a in args:
        starts.append(len(packed))
        if type(a) is DeviceView:
            _pack_view(a, packed)
        else:
            packed.append(a)
    return Launch("kernel", "config", "stream", tuple(args), tuple(packed), tuple(starts))


def test_a_plan_is_made_only_of_launches_on_memory_it_can_account_for(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(replay, "ALIGN", 64)        # (the host allocator's alignment)
    q, k, v = (torch.zeros(2, 8, 4) for _ in range(3))
    pair = registry.PAIRS["wgmma16"]

    def view(x, shape=None, pool=False, offset=0):
        v = DeviceView(x.data_ptr() + offset, shape or (2, *x.shape[1:]), np.float32, owner=x)
        v.pool_owner = x if pool else None
        return v

    # the call: out and lse from the pool; a workspace D; two launches, the second reading D
    # at an offset; the tensor maps, memory of their own
    out, lse, work = torch.zeros(2, 8, 4), torch.zeros(2, 8), torch.zeros(2, 16)
    allocations = [view(out, pool=True), view(lse, pool=True), view(work, pool=True)]
    maps = DeviceView(1 << 20, (3, 128), np.uint8, owner=np.zeros(1))
    first = [view(q), view(k), view(v), allocations[0], allocations[1], ctypes.c_float(0.5), 2,
             1, maps]
    second = [allocations[1], view(work, (2, 8), offset=32), 7]

    def made(events, results=(out, lse), p=pair):
        replay.clear()
        replay.remember("key", p, events, (q, k, v), results)
        return replay._plans.get("key")

    events = [*allocations, _fake_launch(first), _fake_launch(second)]
    before = replay.counts["made"]
    plan = made(events)
    assert plan is not None and replay.counts["made"] == before + 1
    assert plan.allocations == tuple((tuple(x.shape), x.dtype, x.device)
                                     for x in (out, lse, work))
    (_, _, _, packed, slots), (_, _, _, packed2, slots2) = plan.launches
    starts = events[3].starts
    assert slots == ((starts[3] + VIEW_PTR, 0, 0), (starts[4] + VIEW_PTR, 1, 0))
    assert slots2 == ((VIEW_PTR, 1, 0), (events[4].starts[1] + VIEW_PTR, 2, 32))
    assert packed == events[3].packed and plan.held == (maps,)
    assert plan.results == ((0, None), (1, None))
    assert plan.nbytes == out.nbytes + lse.nbytes + work.nbytes
    # the plan keeps no tensor of the call alive (the launches' arguments hold them all)
    assert not any(isinstance(x, (torch.Tensor, DeviceView, Launch))
                   for x in (*plan.launches[0], *plan.launches[1], *plan.results))
    # a result returned in another shape is reshaped at a replay
    assert made(events, (out.reshape(8, 8), lse)).results == ((0, (8, 8)), (1, None))
    # not: a launch Numba packed, no launch at all
    assert made([*allocations, None, _fake_launch(first)]) is None
    assert made(allocations) is None
    # not: memory from the pool that the call did not allocate (another call's workspace)
    stray = torch.zeros(16)
    assert made([*allocations, _fake_launch(first + [view(stray, pool=True)])]) is None
    # not: a result that is not one of the call's allocations, or only part of one
    assert made(events, (out, q)) is None
    assert made(events, (out, lse[:1])) is None
    # not: a pair not marked replayable, or no key
    assert made(events, p=registry.variant("mine", "wgmma16",
                                           make_forward=pair.make_forward)) is None
    replay.remember(None, pair, events, (q, k, v), (out, lse))
    replay.remember("key", pair, None, (q, k, v), (out, lse))     # a call not recorded
    assert replay._plans == {}
    # not: an allocation at an address less aligned than ALIGN (a replay's must be as aligned)
    odd = torch.zeros(2 * 8 * 4 + 4)[4:].reshape(2, 8, 4)
    assert made([view(odd, pool=True), *allocations[1:], _fake_launch(first)]) is None


def test_a_key_is_recorded_from_its_second_call():
    replay.clear()
    assert not replay.repeated(None)
    assert [replay.repeated("a"), replay.repeated("b"), replay.repeated("a")] == [False, False,
                                                                                  True]
    replay.clear()                                  # clear forgets the keys met too
    assert not replay.repeated("a")


def test_a_variant_with_kernels_of_its_own_is_not_replayed():
    assert all(p.replay for p in registry.PAIRS.values() if "(test)" not in p.name)
    assert not registry.variant("v", "fa2", make_forward=lambda *a: None).replay
    assert not registry.variant("v", "fa2", run_backward=lambda *a, **kw: None).replay
    assert registry.variant("v", "fa2", summary="mine").replay
    assert registry.variant("v", "fa2", make_forward=lambda *a: None, replay=True).replay


def test_only_torch_cuda_tensors_and_plain_options_are_keyed(monkeypatch):
    # (the simulator's answer is always None: the rules below it are run as on a GPU, up to
    # the stream and context lookups, which a key that reaches them would fail on here)
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(replay, "SIMULATOR", False)
    monkeypatch.setattr(replay, "current_context", lambda: pytest.fail("keyed"))
    q = np.zeros((1, 2, 8, 4), np.float32)
    t = torch.zeros(1, 2, 8, 4)
    assert replay.key((q, q, q), ("forward",)) is None              # NumPy
    assert replay.key((t, t, q), ("forward",)) is None              # one not a tensor
    assert replay.key((t, t, t), ("forward", np.float32(1))) is None   # a NumPy scalar option
    assert replay.key((t, t, t), ("forward", False)) is None        # on the host


# --- on a GPU ------------------------------------------------------------------------------

def _inputs(torch, dtype, shape=(1, 3, 200, 64), kv_shape=None):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(shape, device="cuda", dtype=getattr(torch, dtype), generator=gen)
    k, v = (torch.randn(kv_shape or shape, device="cuda", dtype=getattr(torch, dtype),
                        generator=gen) for _ in range(2))
    return q, k, v


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,dtype", [
    ("auto", "bfloat16"), ("auto", "float16"), ("auto", "float32"), ("fa2", "float32"),
    ("mma16", "bfloat16"), ("wgmma", "bfloat16"), ("wgmma16-tf32bwd", "float16")])
def test_gpu_a_repeated_call_replays_what_it_did(monkeypatch, kernel, dtype):
    # forward and backward (atomic dq and deterministic), GQA, Nq != Nk, causal; the half
    # inputs of "wgmma" are widened by kernels of their own into workspace, and so are the
    # backward's of "wgmma16-tf32bwd"
    torch = pytest.importorskip("torch")
    from numba_flash import api, arrays, flash_attention_backward, flash_attention_forward
    q, k, v = _inputs(torch, dtype, (2, 4, 200, 64), (2, 2, 333, 64))
    dout = torch.randn_like(q)
    checked = []
    real_import, real_validate = arrays.to_device, api._validate
    monkeypatch.setattr(arrays, "to_device",
                        lambda *a, **kw: checked.append(1) or real_import(*a, **kw))
    monkeypatch.setattr(api, "_validate", lambda *a: checked.append(1) or real_validate(*a))
    forward = lambda: flash_attention_forward(q, k, v, causal=True, kernel=kernel)  # noqa: E731
    out, lse = forward()
    for deterministic in (False, True):
        def backward():
            return flash_attention_backward(dout, q, k, v, out, lse, causal=True,
                                            kernel=kernel, deterministic=deterministic)
        for call in (forward, backward):
            replay.clear()
            checked.clear()
            with arrays.AllocationMeter() as full_bytes:
                first = call()                  # its key's first call: noted, no plan
            assert checked and not replay._plans
            call()                              # its second: recorded, the plan made
            assert len(replay._plans) == 1
            checked.clear()
            with arrays.AllocationMeter() as again_bytes:
                again = call()
            torch.cuda.synchronize()
            assert not checked                  # a replay imports no array and checks nothing
            assert again_bytes.bytes == full_bytes.bytes
            for i, (a, b) in enumerate(zip(first, again)):
                assert a.data_ptr() != b.data_ptr()      # new results of the same kind
                assert (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device)
                if call is backward and i == 0 and not deterministic:
                    # dq added by atomics: its last bits vary from call to call
                    assert torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-3)
                else:
                    assert torch.equal(a, b), (call.__name__, i)
            # another option is another call: in full, and (at its second) a plan of its own
            checked.clear()
            for _ in range(2):
                if call is forward:
                    flash_attention_forward(q, k, v, causal=False, kernel=kernel)
                else:
                    flash_attention_backward(dout, q, k, v, out, lse, causal=True,
                                             kernel=kernel, deterministic=deterministic,
                                             scale=0.1)
            assert checked and len(replay._plans) == 2


@pytest.mark.gpu
def test_gpu_a_plan_serves_only_the_call_it_was_made_of(monkeypatch, hold_stream):
    torch = pytest.importorskip("torch")
    from numba_flash import flash_attention_forward
    q, k, v = _inputs(torch, "bfloat16")
    out, lse = flash_attention_forward(q, k, v, causal=True)
    flash_attention_forward(q, k, v, causal=True)          # (the plan: at a key's second call)
    (plan_key, plan), = replay._plans.items()
    # another stream: a plan of its own, whose launch goes on that stream (held by the host
    # until the block ends). (The full calls come first, unheld: on a new stream the first
    # copies the tensor maps from pageable host memory, which may wait for the stream.)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out2, _ = flash_attention_forward(q, k, v, causal=True)        # in full
        flash_attention_forward(q, k, v, causal=True)                  # in full, the plan
        with hold_stream(side.cuda_stream) as timed_out:
            out3, _ = flash_attention_forward(q, k, v, causal=True)    # replayed
            assert not side.query() and not timed_out()
    side.synchronize()
    assert len(replay._plans) == 2 and torch.equal(out2, out) and torch.equal(out3, out)
    # an input at another address: in full
    q2 = q.clone()
    for _ in range(2):
        flash_attention_forward(q2, k, v, causal=True)
    assert len(replay._plans) == 3
    held = weakref.ref(q2)                          # and its plan does not keep it alive
    del q2
    assert held() is None
    # a plan that does not serve (outputs not aligned as its call's were; the pair replaced
    # in the registry by hand) runs the call in full, with the same result
    monkeypatch.setattr(replay, "ALIGN", 1 << 40)
    runs = []
    real_run = plan.run
    monkeypatch.setattr(replay, "run", lambda key: runs.append(key) or real_run())
    out4, lse4 = flash_attention_forward(q, k, v, causal=True)
    assert runs == [plan_key] and torch.equal(out4, out) and torch.equal(lse4, lse)
    monkeypatch.setattr(replay, "ALIGN", 256)
    pair = registry.PAIRS[plan.pair.name]
    monkeypatch.setitem(registry.PAIRS, pair.name, registry.variant(pair.name, pair.name))
    assert plan.run() is None
