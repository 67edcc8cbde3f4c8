"""Call plans: an API call on torch tensors replayed from the launches and allocations it made.

Most of the host time of flash_attention_forward and _backward on torch CUDA tensors goes to
work whose answer does not change from call to call: the checks, the registry, the arrays'
views, the kernels' specializations, alignment and tensor maps, the arguments' packing. At a
size where the host bounds the loop (B = 1, H = 2, N = 128, wgmma16, bf16, causal) a forward
took 158 us of host, its launches left out 124 of them, and torch's flash SDPA 21 (an H100's
host, 2026-12-06 17:18, tools/host_pieces.py). At the benchmark's causal N = 1k a forward's
kernel is ~240 us: that host time is what a synchronized call adds to it.

A call whose arrays match a remembered call's in everything that work reads makes the same
launches but for pointers: the tensors' shapes, dtypes, devices, contiguity, requires_grad,
their data pointers modulo ALIGN (the kernels choose their code by alignment) and how they
overlap one another (which earlier tensor each overlaps, and at what offset); the options
(causal, scale, tiles, kernel, deterministic: each of a plain scalar type); the current stream
and CUDA context; the registry's generation and the pair's identity (`key`). Such a call here
allocates what the remembered call allocated (its outputs, and workspace such as D) and makes
its launches, in order, from their packed arguments with its own tensors' pointers and the new
allocations' written in, and tensor maps made for them (`Plan.run`; tma.tensor_maps, cached by
pointer): the checks it skips passed for the remembered call and read nothing that differs.
A training loop's tensors come at new addresses each step, and its calls replay all the same
(examples/recall.py counts them). Every allocation is made before the first launch and kept
until the last, as in the recorded call (whose record holds them): a call not recorded (not on
torch tensors, or its key's first call) frees its workspace as it goes.

A key's first call only notes the key (`repeated`); its second is recorded and makes the plan;
its third replays. A plan is made (`remember`) only of a call on a GPU whose pair marks its
kernels replayable (registry.Pair.replay), every launch of which the Launcher packed
(launch.recording), and whose launches' array arguments all lie in the call's tensors, in
memory the call took from torch's pool (launch.note, from arrays.empty_device: allocated anew
at each replay) or in tensor maps of those (remade at each replay); and whose results are
such allocations. A plan holds no tensor of the call.
"""

import collections
import math

from . import registry
from .arrays import AllocationMeter, torch_module
from .kernels.launch import SIMULATOR, VIEW_PTR, DeviceView, Launch, current_context
from .kernels.sm90.tma import MapsMemory, tensor_maps

# a process that meets many shapes or options makes a plan of each: the dict is cleared at
# this size
PLAN_ENTRIES = 256
_plans = {}

# keys met once: a call is recorded, and its plan made, only when its key comes back, so that
# calls that never repeat (a new shape, option or stream each time) pay for the key alone (a
# recorded call and its plan cost ~25 us more than the call with plans off: 146 against 121
# us, 2026-12-06 17:42, tools/host_pieces.py)
MET_ENTRIES = 4096
_met = set()

# calls served by a plan ("replayed") and plans made ("made") in this process: how often a
# workload's calls repeat (examples/recall.py reports them for its training steps)
counts = collections.Counter()

# allocations of a replay must be aligned to this many bytes, as the remembered call's were
# (torch's caching allocator hands out 512-byte aligned blocks): the kernels choose their
# code by 16-byte alignment (vector_io.aligned, tma.tma_ready)
ALIGN = 256

# the types a keyed option may have: immutable scalars (a 0-d tensor as scale can change in
# place, and is hashed by its identity); `type` for the options' own types
_OPTION_TYPES = frozenset((type(None), bool, int, float, str, type))


def _torch_tensor():
    """torch.Tensor if torch is imported (an input can only be a tensor then), else None."""
    torch = torch_module()
    return None if torch is None else torch.Tensor


def key(xs, options):
    """The plan key of a call on arrays xs (the API's order) with `options` (the API's tuple
    of values and their types), or None where no plan can serve: not all plain torch CUDA
    tensors, a lazy negation (torch's negative bit) or a tensor without storage among them,
    an option that is not a plain scalar, the simulator. Of each tensor: its data pointer
    modulo ALIGN, every earlier tensor whose memory it overlaps with the offset between them
    (so that memory found in one at the remembered call is found there at a replay), shape,
    dtype, device, contiguity and requires_grad (_layout)."""
    tensor = _torch_tensor()
    if SIMULATOR or tensor is None:
        return None
    for x in xs:
        if type(x) is not tensor or x.is_neg():     # (a lazy negation: the full call refuses it)
            return None
    for o in options:
        if type(o) not in _OPTION_TYPES:
            return None
    if not xs[0].is_cuda:
        return None
    device = xs[0].get_device()
    import torch
    try:
        layout = _layout(xs)
    except RuntimeError:        # (a tensor without storage, e.g. sparse: no data pointer)
        return None
    return (options, torch._C._cuda_getCurrentRawStream(device), current_context(),
            registry.generation(), layout)


def _layout(xs):
    """What the plan key holds of tensors xs: (parts, overlaps). parts: of each tensor its
    data pointer modulo ALIGN, shape, dtype, device, contiguity and requires_grad; overlaps:
    () when no two tensors share memory (the usual case, found in one pass over the spans in
    address order), else of each tensor the earlier ones whose memory it overlaps, as (index,
    its pointer minus theirs)."""
    parts, spans = [], []
    for x in xs:
        p = x.data_ptr()
        parts += (p % ALIGN, x.shape, x.dtype, x.get_device(), x.is_contiguous(),
                  x.requires_grad)
        spans.append((p, x.nbytes))
    ordered = sorted(spans)
    for (p, n), (q, _) in zip(ordered, ordered[1:]):
        if p + n > q:
            break
    else:
        return tuple(parts), ()
    overlaps = tuple(tuple((j, p - q) for j, (q, m) in enumerate(spans[:i])
                           if q < p + n and p < q + m)
                     for i, (p, n) in enumerate(spans))
    return tuple(parts), overlaps


class Plan:
    """One remembered call: run() allocates what it allocated and makes its launches with
    the new pointers (module docstring).
    inputs: how many tensors the call takes; allocations: (shape, dtype, device) of each
    torch tensor the call took from the pool; launches: (kernel, config, stream, packed,
    slots, maps) each: slots (position in packed, source, byte offset) where a pointer goes,
    source i < inputs the call's tensor i, else allocation i - inputs; maps (position,
    mapped, stream) where the tensor maps of `mapped` ((source, byte offset, shape, dtype)
    each) go; results: (allocation, shape) of each array returned."""

    __slots__ = ("pair", "inputs", "allocations", "launches", "results", "nbytes")

    def __init__(self, pair, inputs, allocations, launches, results):
        self.pair, self.inputs, self.allocations = pair, inputs, allocations
        self.launches, self.results = launches, results
        self.nbytes = sum(math.prod(shape) * dtype.itemsize for shape, dtype, _ in allocations)

    def run(self, xs):
        """The results of the call on tensors xs (the key's) as the API returns them, or
        None where the plan does not serve (the pair was replaced in the registry by hand;
        an allocation not aligned as the remembered call's was): the caller then runs the
        call in full."""
        import torch
        from cuda.core import launch
        if registry.PAIRS.get(self.pair.name) is not self.pair:
            return None
        tensors = [torch.empty(shape, dtype=dtype, device=device)
                   for shape, dtype, device in self.allocations]
        pointers = [x.data_ptr() for x in xs]
        for t in tensors:
            p = t.data_ptr()
            if p % ALIGN:
                return None
            pointers.append(p)
        made = []   # the maps, held until their launch is queued (the cache may evict them)
        for kernel, config, stream, packed, slots, maps in self.launches:
            packed = list(packed)
            for at, a, offset in slots:
                packed[at] = pointers[a] + offset
            for at, mapped, maps_stream in maps:
                made.append(tensor_maps([DeviceView(pointers[a] + offset, shape, dtype)
                                         for a, offset, shape, dtype in mapped], maps_stream))
                packed[at] = made[-1].ptr
            launch(stream, config, kernel, *packed)
        for meter in AllocationMeter.active:
            meter.bytes += self.nbytes
        return tuple(tensors[a] if shape is None else tensors[a].reshape(shape)
                     for a, shape in self.results)


def repeated(plan_key):
    """True when plan_key (None: False) was met before: the call is then recorded to make
    its plan (remember); False the first time, which notes it."""
    if plan_key is None:
        return False
    if plan_key in _met:
        return True
    if len(_met) >= MET_ENTRIES:
        _met.clear()
    _met.add(plan_key)
    return False


def run(plan_key, xs):
    """The remembered plan's results for plan_key, the key of a call on tensors xs, or None
    (no plan, or it does not serve)."""
    plan = _plans.get(plan_key)
    if plan is None:
        return None
    results = plan.run(xs)
    if results is not None:
        counts["replayed"] += 1
    return results


def _containing(spans, lo, hi):
    """Index of the last span (pointer, nbytes) holding [lo, hi), or None."""
    for i in range(len(spans) - 1, -1, -1):
        p, n = spans[i]
        if p <= lo and hi <= p + n:
            return i
    return None


def _mapped(spans, maps):
    """What tensor maps (a tma.MapsMemory) map, as Plan.launches' `mapped`, or None where an
    array they map is not C-contiguous or lies in none of spans."""
    mapped = []
    for ptr, shape, dtype, strides in maps.arrays:
        at = _containing(spans, ptr, ptr + math.prod(shape) * dtype.itemsize)
        if at is None or DeviceView(0, shape, dtype).strides != strides:
            return None
        mapped.append((at, ptr - spans[at][0], shape, dtype))
    return tuple(mapped)


def remember(plan_key, pair, events, inputs, results):
    """Make and keep the plan of a call that passed its checks, recorded `events`
    (launch.recording's list) on tensors `inputs` and returned `results`; nothing where the
    call cannot be replayed (module docstring)."""
    if plan_key is None or events is None or not pair.replay or not events:
        return
    tensor = _torch_tensor()
    # the call's tensors, then its allocations as they come: a slot's source indexes this
    spans = [(x.data_ptr(), x.nbytes) for x in inputs]
    owners, launches = [], []
    for e in events:
        if type(e) is DeviceView:                   # an allocation from the pool
            owner = e.pool_owner
            if type(owner) is not tensor or owner.data_ptr() % ALIGN:
                return
            owners.append(owner)
            spans.append((owner.data_ptr(), owner.nbytes))
            continue
        if type(e) is not Launch:
            return                                  # a launch Numba packed
        slots, maps = [], []
        for a, start in zip(e.args, e.starts):
            if type(a) is not DeviceView:
                if isinstance(a, tensor) or hasattr(a, "__cuda_array_interface__"):
                    return      # (an array the Launcher packed as a scalar: none today)
                continue        # a scalar: kept as packed
            lo, hi = a.ptr, a.ptr + a.nbytes
            # (allocations, held by the recording, overlap nothing: only overlapping inputs
            # can both hold an argument, and the key fixes their offsets to each other)
            at = _containing(spans, lo, hi)
            if at is not None:
                slots.append((start + VIEW_PTR, at, lo - spans[at][0]))
            elif type(a.owner) is MapsMemory:       # tensor maps: remade at each replay
                mapped = _mapped(spans, a.owner)
                if mapped is None:
                    return
                maps.append((start + VIEW_PTR, mapped, a.owner.stream))
            else:
                # memory the plan cannot account for (other memory of the call's own could
                # hold what depends on its pointers, as tensor maps do)
                return
        launches.append((e.kernel, e.config, e.stream, e.packed, tuple(slots), tuple(maps)))
    returned, n = [], len(inputs)
    for r in results:
        at = None if type(r) is not tensor else _containing(spans, r.data_ptr(),
                                                             r.data_ptr() + r.nbytes)
        if at is None or at < n or spans[at] != (r.data_ptr(), r.nbytes):
            return              # a result that is not one of the call's allocations
        returned.append((at - n, None if r.shape == owners[at - n].shape else tuple(r.shape)))
    if not launches:
        return
    if len(_plans) >= PLAN_ENTRIES:
        _plans.clear()
    allocations = tuple((tuple(o.shape), o.dtype, o.device) for o in owners)
    _plans[plan_key] = Plan(pair, n, allocations, tuple(launches), tuple(returned))
    counts["made"] += 1


def clear():
    """Forget every plan and every key met (the tests, and a process that wants its memory
    back)."""
    _plans.clear()
    _met.clear()
