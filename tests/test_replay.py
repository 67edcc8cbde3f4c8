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


def test_a_plan_is_made_only_of_one_packed_launch_on_the_calls_own_memory(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(replay, "ALIGN", 64)        # (the host allocator's alignment)
    q, k, v, out = (torch.zeros(2, 8, 4) for _ in range(4))
    lse = torch.zeros(2, 8)
    pair = registry.PAIRS["wgmma16"]

    def view(x, **kw):
        v = DeviceView(x.data_ptr(), (2, *x.shape[1:]), np.float32, owner=x)
        for name, value in kw.items():
            setattr(v, name, value)
        return v
    maps = DeviceView(1 << 20, (3, 128), np.uint8, owner=np.zeros(1))   # memory of its own
    args = [view(q), view(k), view(v), view(out, pool_owner=out), view(lse, pool_owner=lse),
            ctypes.c_float(0.5), 2, 1, maps]

    def made(launches, p=pair):
        replay.clear()
        replay.remember("key", p, launches, (q, k, v), out, lse)
        return replay._plans.get("key")

    plan = made([_fake_launch(args)])
    assert plan is not None
    launch = _fake_launch(args)
    assert plan.packed == launch.packed
    assert [plan.packed[i] for i in plan.out_at + plan.lse_at] == [out.data_ptr(),
                                                                   lse.data_ptr()]
    assert plan.out_at == (launch.starts[3] + VIEW_PTR,)
    assert plan.held == (maps,)
    # the plan keeps no tensor of the call alive (the launch's arguments hold them all)
    assert not any(isinstance(getattr(plan, f), (torch.Tensor, DeviceView, Launch))
                   for f in plan.__slots__)
    # lse in place of the maps (the kernels without TMA): both of its places are written
    launch = _fake_launch(args[:-1] + [args[4]])
    assert made([launch]).lse_at == tuple(launch.starts[i] + VIEW_PTR for i in (4, 8))
    assert plan.nbytes == out.nbytes + lse.nbytes
    # not: two launches (half inputs widened first), one Numba packed, none
    assert made([_fake_launch(args)] * 2) is None
    assert made([None]) is None
    assert made([]) is None
    # not: a workspace from the pool among the arguments (freed once the call returns)
    work = torch.zeros(16)
    assert made([_fake_launch(args + [view(work, pool_owner=work)])]) is None
    # not: out or lse missing from the arguments, or only part of out
    assert made([_fake_launch(args[:4] + args[5:])]) is None
    part = DeviceView(out.data_ptr(), (1, 8, 4), np.float32, owner=out)
    assert made([_fake_launch(args[:3] + [part] + args[4:])]) is None
    # not: a pair whose forward is not marked replayable
    assert made([_fake_launch(args)], registry.variant("mine", "wgmma16",
                                                       make_forward=pair.make_forward)) is None
    replay.remember(None, pair, [_fake_launch(args)], (q, k, v), out, lse)
    assert replay._plans == {}
    # not: an output at an address less aligned than ALIGN (a replay's must be as aligned)
    out = torch.zeros(2 * 8 * 4 + 4)[4:].reshape(2, 8, 4)
    args[3] = view(out, pool_owner=out)
    assert made([_fake_launch(args)]) is None


def test_a_variant_with_a_forward_of_its_own_is_not_replayed():
    assert all(p.replay_forward for p in registry.PAIRS.values() if "(test)" not in p.name)
    assert not registry.variant("v", "fa2", make_forward=lambda *a: None).replay_forward
    assert registry.variant("v", "fa2", run_backward=lambda *a, **kw: None).replay_forward
    assert registry.variant("v", "fa2", make_forward=lambda *a: None,
                            replay_forward=True).replay_forward


def test_only_torch_tensors_and_plain_options_are_keyed():
    q = np.zeros((1, 2, 8, 4), np.float32)
    assert replay.key(q, q, q, ("forward",)) is None
    torch = pytest.importorskip("torch")
    t = torch.zeros(1, 2, 8, 4)                     # on the host: never on a GPU's plan
    assert replay.key(t, t, t, ("forward", False)) is None


# --- on a GPU ------------------------------------------------------------------------------

def _inputs(torch, dtype, shape=(1, 3, 200, 64), kv_shape=None):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(shape, device="cuda", dtype=getattr(torch, dtype), generator=gen)
    k, v = (torch.randn(kv_shape or shape, device="cuda", dtype=getattr(torch, dtype),
                        generator=gen) for _ in range(2))
    return q, k, v


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,dtype,planned", [
    ("auto", "bfloat16", True), ("auto", "float16", True), ("auto", "float32", True),
    ("fa2", "float32", True), ("mma16", "bfloat16", True),
    ("wgmma", "bfloat16", False)])              # widened first: three launches, no plan
def test_gpu_a_repeated_forward_replays_the_launch_it_made(monkeypatch, kernel, dtype,
                                                           planned):
    torch = pytest.importorskip("torch")
    from numba_flash import api, arrays, flash_attention_forward
    q, k, v = _inputs(torch, dtype, (2, 4, 200, 64), (2, 2, 333, 64))      # GQA, Nq != Nk
    with arrays.AllocationMeter() as full_bytes:
        out, lse = flash_attention_forward(q, k, v, causal=True, kernel=kernel)
    assert len(replay._plans) == int(planned)
    checked = []
    real = arrays.to_device
    monkeypatch.setattr(arrays, "to_device", lambda *a, **kw: checked.append(1) or real(*a, **kw))
    real_validate = api._validate
    monkeypatch.setattr(api, "_validate", lambda *a: checked.append(1) or real_validate(*a))
    with arrays.AllocationMeter() as again_bytes:
        out2, lse2 = flash_attention_forward(q, k, v, causal=True, kernel=kernel)
    torch.cuda.synchronize()
    assert bool(checked) != planned          # a replay imports no array and checks nothing
    assert again_bytes.bytes == full_bytes.bytes
    assert out2.data_ptr() != out.data_ptr()  # new outputs, the same values bit for bit
    assert (out2.shape, out2.dtype, lse2.shape, lse2.dtype) == (out.shape, out.dtype,
                                                                lse.shape, lse.dtype)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    # another option is another call: in full, and a plan of its own
    checked.clear()
    flash_attention_forward(q, k, v, causal=False, kernel=kernel)
    assert checked
    assert len(replay._plans) == 2 * int(planned)


@pytest.mark.gpu
def test_gpu_a_plan_serves_only_the_call_it_was_made_of(monkeypatch):
    torch = pytest.importorskip("torch")
    from numba_flash import flash_attention_forward
    q, k, v = _inputs(torch, "bfloat16")
    out, lse = flash_attention_forward(q, k, v, causal=True)
    (plan_key, plan), = replay._plans.items()
    # another stream: a plan of its own, the launch on that stream
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)              # (tens of ms queued in front of it)
        out2, _ = flash_attention_forward(q, k, v, causal=True)
        assert not side.query()                    # queued behind the sleep, not run
    side.synchronize()
    assert len(replay._plans) == 2 and torch.equal(out2, out)
    # an input at another address: in full
    q2 = q.clone()
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
    out3, lse3 = flash_attention_forward(q, k, v, causal=True)
    assert runs == [plan_key] and torch.equal(out3, out) and torch.equal(lse3, lse)
    monkeypatch.setattr(replay, "ALIGN", 256)
    pair = registry.PAIRS[plan.pair.name]
    monkeypatch.setitem(registry.PAIRS, pair.name, registry.variant(pair.name, pair.name))
    assert plan.run() is None
