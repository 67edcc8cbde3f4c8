"""numba_flash.torch: the autograd function and the torch.library ops. On the simulator with CPU
tensors (tiny sizes, the readable "rowwise" pair where a test trains: the fastest there); on a
GPU (`gpu`) under a side stream with work queued in front, and training the example model."""

import math
import pathlib
import sys

import numpy as np
import pytest

import numba_flash

torch = pytest.importorskip("torch")
F = torch.nn.functional

from numba_flash.torch import flash_attention  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEVICE = "cpu" if numba_flash.SIMULATOR else "cuda"


def sdpa_bottom_right(q, k, v, causal, scale=None):
    """SDPA with numba-flash's mask (bottom-right causal) and GQA by repeated key heads."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    mask = None
    if causal:
        nq, nk = q.shape[-2], k.shape[-2]
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        mask = j <= i + (nk - nq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def test_matches_sdpa_with_gqa_and_strided_views():
    # q, k, v as a model makes them: views of one fused projection (not contiguous); GQA
    # H = 2 over Hk = 1; Nq != Nk, causal (bottom-right); the default kernel; float64 truth
    B, H, Hk, Nq, Nk, d, causal = 1, 2, 1, 4, 6, 5, True

    def run(attention, dtype):
        torch.manual_seed(0)
        fused_q = torch.randn(B, Nq, H, d).to(DEVICE, dtype).requires_grad_()
        fused_kv = torch.randn(B, Nk, 2, Hk, d).to(DEVICE, dtype).requires_grad_()
        q = fused_q.transpose(1, 2)
        k, v = fused_kv.permute(2, 0, 3, 1, 4).unbind(0)
        assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
        out = attention(q, k, v, causal=causal)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(
            DEVICE, dtype))
        return out, fused_q.grad, fused_kv.grad

    ours = run(flash_attention, torch.float32)
    truth = run(sdpa_bottom_right, torch.float64)
    assert ours[0].dtype == torch.float32 and ours[0].shape == (B, H, Nq, d)
    for got, want, tol in zip(ours, truth, (1e-5, 1e-4, 1e-4)):
        assert got.shape == want.shape and (got.double() - want).abs().max().item() < tol


def test_a_lazy_negation_is_read_as_its_values():
    # torch._neg_view(x) holds x's memory and means -x. torch's dispatcher resolves it before
    # the custom op runs (its fallback for the Negative key), so the op sees -x, never the raw
    # memory (the plain API, which reads memory as stored, refuses such tensors instead)
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 2, 5, 4, device=DEVICE) for _ in range(3))
    got = flash_attention(q, torch._neg_view(k), torch._neg_view(v), causal=True)
    want = flash_attention(q, -k, -v, causal=True)
    assert torch.equal(got, want) and not torch.equal(got, flash_attention(q, k, -v, causal=True))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_tensors_in_half_out_within_the_half_tolerance(dtype):
    # bf16 / fp16 tensors (GQA, causal with Nq != Nk): out and the gradients in that dtype,
    # lse float32; each within the half tolerance rule against float64 truth
    from numba_flash.testing import check_backward, check_forward
    B, H, Hk, Nq, Nk, d = 1, 2, 1, 5, 7, 8
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(s, generator=g).to(DEVICE, getattr(torch, dtype)).requires_grad_()
               for s in ((B, H, Nq, d), (B, Hk, Nk, d), (B, Hk, Nk, d)))
    dout = torch.randn(B, H, Nq, d, generator=g).to(DEVICE, getattr(torch, dtype))
    out = flash_attention(q, k, v, causal=True)
    out.backward(dout)
    lse = torch.ops.numba_flash.forward(q, k, v, True, 1 / math.sqrt(d), "auto", False)[1]
    assert out.dtype == q.grad.dtype == k.grad.dtype == v.grad.dtype == getattr(torch, dtype)
    assert lse.dtype == torch.float32

    def host(t):        # exact values, in the dtype the tolerance rule is keyed on
        return t.detach().float().cpu().numpy().astype(np.dtype(dtype))
    qh, kh, vh, dh = (host(t) for t in (q, k, v, dout))
    for c in check_forward(qh, kh, vh, host(out), lse.cpu().numpy(), causal=True) + \
            check_backward(dh, qh, kh, vh, host(q.grad), host(k.grad), host(v.grad), causal=True):
        assert c.ok, c


def test_float64_gradients_pass_gradcheck():
    torch.manual_seed(1)
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 1, 4, 4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    v = torch.randn(1, 1, 4, 4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    fn = lambda q, k, v: flash_attention(q, k, v, causal=True, scale=0.7)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


def test_ops_pass_opcheck():
    # schema, fake (meta) implementations, autograd registration, AOT dispatch
    torch.manual_seed(2)
    q = torch.randn(1, 1, 2, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 1, 3, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    v = torch.randn(1, 1, 3, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    args = (q, k, v, True, 0.5, "rowwise", False)
    torch.library.opcheck(torch.ops.numba_flash.forward, args)
    out, lse = torch.ops.numba_flash.forward(*args)
    back = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, True,
            0.5, "rowwise", False)
    torch.library.opcheck(torch.ops.numba_flash.backward, back)


def test_compiles_fullgraph_with_the_same_numbers():
    # dynamo traces the ops through their fake implementations: fullgraph=True fails on any
    # graph break. aot_eager: the same graph without inductor's C++ build (GPU test: inductor)
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 1, 5, 4, device=DEVICE, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        return flash_attention(q, k, v, causal=True, kernel="rowwise").sin().sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    eager_loss = f(q, k, v)
    eager = torch.autograd.grad(eager_loss, (q, k, v))
    compiled_loss = compiled(q, k, v)
    traced = torch.autograd.grad(compiled_loss, (q, k, v))
    assert compiled_loss.item() == eager_loss.item()
    for a, b in zip(traced, eager):
        assert torch.equal(a, b)


def test_double_backward_is_an_error_not_a_silent_answer():
    """The backward has no derivative of its own: a second backward (a gradient penalty,
    create_graph=True) must raise, not treat dq as a constant (an eager autograd.Function
    whose body detached its inputs did that, 2026-12-06)."""
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 1, 3, 4, dtype=torch.float64, device=DEVICE, requires_grad=True)
               for _ in range(3))
    out = flash_attention(q, k, v, causal=True, kernel="rowwise")
    dq, = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="autograd formula"):
        torch.autograd.grad((dq ** 2).sum(), q)


def test_bad_input_is_a_clear_error_before_any_launch():
    q = torch.randn(1, 1, 3, 4, device=DEVICE)
    with pytest.raises(TypeError, match="causal must be True or False"):
        flash_attention(q, q, q, causal="no")
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        flash_attention(q.tolist(), q, q)
    with pytest.raises(TypeError, match="scale must be a real number"):
        flash_attention(q, q, q, scale="abc")
    with pytest.raises(TypeError, match="kernel must be a registered name"):
        flash_attention(q, q, q, kernel=["fa2"])
    with pytest.raises(ValueError, match="head dims differ"):
        flash_attention(q, q[..., :3], q)
    with pytest.raises(TypeError, match="must be one of float16, bfloat16, float32, float64"):
        flash_attention(q.int(), q.int(), q.int())


def _recall():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import recall
    finally:
        sys.path.pop(0)
    return recall


@pytest.mark.parametrize("dtype,agree", [("float32", 1e-4), ("bfloat16", 1e-2)])
def test_training_a_tiny_model_matches_sdpa_and_its_loss_falls(dtype, agree):
    # bfloat16: mixed precision (autocast), where SDPA and numba-flash round differently
    recall = _recall()
    task = recall.Task(pairs=2, queries=2, keys=4)
    result = recall.compare(task, steps=3, batch_size=4, width=8, heads=2, layers=1, lr=1e-2,
                            kernel="rowwise" if numba_flash.SIMULATOR else "auto",
                            device=DEVICE, dtype=getattr(torch, dtype))
    ours, theirs = result["runs"]["numba-flash"]["loss"], result["runs"]["sdpa"]["loss"]
    if numba_flash.SIMULATOR:
        assert result["resolved"] == "rowwise"
    else:
        assert result["resolved"] in numba_flash.registry.PAIRS
    for run in result["runs"].values():     # a time per step; the median leaves the first out
        assert len(run["step_seconds"]) == 3
        assert run["seconds_per_step"] == np.median(run["step_seconds"][1:])
    # calls replayed from plans (numba_flash.replay): none on the simulator, none by SDPA
    assert result["runs"]["sdpa"]["plans"] == {"replayed": 0, "made": 0}
    if numba_flash.SIMULATOR:
        assert result["runs"]["numba-flash"]["plans"] == {"replayed": 0, "made": 0}
    assert ours[-1] < ours[0]
    assert result["max_relative_loss_difference"] < agree, (ours, theirs)


# ------------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
def test_gpu_ordered_on_a_side_stream_after_queued_work():
    # q is written on a side stream behind ~0.1 s of queued GPU work: kernels on another stream
    # (or a host sync on the wrong one) would read it unwritten; out is read on that stream.
    # The pair is compiled first, so the call returns while the sleep still runs: the host did
    # not wait (side.query() False), and the result is right only if the kernels were ordered
    torch.manual_seed(4)
    q_true, k, v = (torch.randn(2, 4, 1000, 64, device="cuda", requires_grad=True)
                    for _ in range(3))
    flash_attention(q_true, k, v, causal=True).sum().backward()        # compile, off the clock
    expected = sdpa_bottom_right(q_true.double(), k.double(), v.double(), True)
    grads = torch.autograd.grad(expected.sum(), (q_true, k, v))
    k.grad = v.grad = None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        q = torch.zeros_like(q_true)
        torch.cuda._sleep(200_000_000)                 # ~0.1 s of GPU time in front
        q.copy_(q_true.detach())
        q.requires_grad_()
        out = flash_attention(q, k, v, causal=True)
        queued = not side.query()
        total = (out.double() - expected).abs().max()   # read on the side stream
        out.sum().backward()
    torch.cuda.synchronize()
    assert queued, "the call waited for the side stream's queued work on the host"
    assert total.item() < 1e-4
    for got, truth in zip((q.grad, k.grad, v.grad), grads):
        assert (got.double() - truth).abs().max().item() < 1e-3


@pytest.mark.gpu
def test_gpu_outputs_are_the_allocators_own_tensors():
    # empty_device allocates from torch's caching pool; from_device must hand back that
    # tensor (a view of its storage), not a new tensor over its pointer, for which
    # Tensor.record_stream would silently do nothing
    from numba_flash import arrays
    like = torch.empty(1, device="cuda")
    d_arr = arrays.empty_device((3, 5), np.float32, like=like)
    got = arrays.from_device(d_arr, (15,), like)
    assert got.untyped_storage()._cdata == d_arr.pool_owner.untyped_storage()._cdata
    assert got.data_ptr() == d_arr.ptr
    got.record_stream(torch.cuda.Stream())


@pytest.mark.gpu
def test_gpu_cupy_arrays_run_on_cupys_current_stream(hold_stream):
    # q is written on CuPy's current stream behind a wait that only the host ends
    # (conftest.hold_stream): the call must queue its kernels behind it and return while the
    # stream is held, and once it goes on give the NumPy call's answer. If the held block
    # blocks, its stack is printed after 10 s.
    # Work whose first run may wait for the device is done once on the stream before the
    # hold: in a full gpu run (19:20, 2026-12-06) the held block ran until the hold's timer
    # ended it but printed no stack from the call, so what waited was the copy before it, the
    # first CuPy copy on a new stream (a kernel's first launch loads its module lazily, which
    # may synchronize the context: the CUDA programming guide's lazy loading hazards; or
    # the pool's first block for that stream). That is CuPy's first use, not this call's.
    # Numba frees collected device arrays in batches (the 11th pending free flushes them all,
    # and cuMemFree waits for the device): the pending frees are flushed before the hold and
    # the collector is off while the stream is held.
    import faulthandler
    import gc
    cupy = pytest.importorskip("cupy")
    from numba.cuda.cudadrv import devices
    from numba_flash import flash_attention_forward
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 777, 64)).astype(np.float32) for _ in range(3))
    ref, _ = flash_attention_forward(q, k, v)                   # compiles, off the clock
    q_dev, k_dev, v_dev = (cupy.asarray(x) for x in (q, k, v))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:                                    # first uses, unheld
        flash_attention_forward(q_dev.copy(), k_dev, v_dev)
    stream.synchronize()
    gc.collect()
    context = devices.get_context()
    context.deallocations.clear()
    context.memory_manager.deallocations.clear()
    gc.disable()
    faulthandler.dump_traceback_later(10)
    try:
        with stream, hold_stream(stream.ptr) as timed_out:
            dq = q_dev.copy()                          # produced on the device, on the stream
            out, _ = flash_attention_forward(dq, k_dev, v_dev)
            assert not timed_out(), "the call waited on the host for the stream's held work"
            assert not stream.done, "the stream ran past its hold"
    finally:
        faulthandler.cancel_dump_traceback_later()
        gc.enable()
    stream.synchronize()
    assert np.abs(cupy.asnumpy(out) - ref).max() < 1e-5


@pytest.mark.gpu
def test_gpu_compiled_model_with_inductor_matches_eager():
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", requires_grad=True) for _ in range(3))

    def f(q, k, v):
        return (flash_attention(q, k, v, causal=True) * 2).sum()

    eager = torch.autograd.grad(f(q, k, v), (q, k, v))
    traced = torch.autograd.grad(torch.compile(f, fullgraph=True)(q, k, v), (q, k, v))
    for a, b in zip(traced, eager):
        assert torch.allclose(a, b, rtol=0, atol=1e-5)


@pytest.mark.gpu
def test_gpu_training_matches_sdpa_step_for_step():
    recall = _recall()
    result = recall.compare(recall.Task(), steps=150, batch_size=64, device="cuda")
    runs = result["runs"]
    print(f"max relative loss difference {result['max_relative_loss_difference']:.2e}; "
          f"ms/step sdpa {1e3 * runs['sdpa']['seconds_per_step']:.1f}, numba-flash "
          f"{1e3 * runs['numba-flash']['seconds_per_step']:.1f}; plans "
          f"{runs['numba-flash']['plans']}")
    assert runs["numba-flash"]["plans"]["made"] > 0     # the training calls can be replayed
    assert result["max_relative_loss_difference"] < 1e-2
    assert runs["numba-flash"]["loss"][-1] < 0.5 * runs["numba-flash"]["loss"][0]
    assert math.isclose(np.mean(runs["numba-flash"]["accuracy"][-10:]),
                        np.mean(runs["sdpa"]["accuracy"][-10:]), abs_tol=0.05)
