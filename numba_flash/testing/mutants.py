"""Deliberately broken kernels, made by editing one line of a real kernel's source.

Each mutant names the kernel module, the exact line fragment it changes and what it becomes;
`registered(name)` compiles the edited module and registers the result as a kernel variant
for the duration of a `with` block. The property suite must catch every mutant
(tests/test_mutants.py), which is the evidence that it has teeth. A mutant whose fragment no
longer occurs in the source fails loudly, so a refactor cannot silently disarm it.
"""

import contextlib
import functools
import importlib
import inspect
import types
from dataclasses import dataclass

from .. import kernels


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: str          # "forward" or "backward"
    module: str        # module in numba_flash.kernels
    original: str      # fragment of one line, must occur exactly once
    mutated: str
    prop: str          # the property expected to catch it
    options: tuple = ()  # (name, value) keyword arguments for a backward's run_backward


MUTANTS = {m.name: m for m in (
    Mutant("l not rescaled when m grows", "forward", "forward_rowwise",
           "l *= alpha", "l *= T(1.0)", "forward agrees"),
    Mutant("O not rescaled when m grows", "forward", "forward_rowwise",
           "o_i[c] *= alpha", "o_i[c] *= T(1.0)", "forward agrees"),
    Mutant("l not rescaled (tiled)", "forward", "forward_tiled",
           "l_row[r] = alpha_row[r] * l_row[r] + l_sum", "l_row[r] = l_row[r] + l_sum",
           "forward agrees"),
    Mutant("causal offset off by one", "forward", "forward_tiled",
           "j + nq > m0 + r + nk", "j + nq >= m0 + r + nk", "forward agrees"),
    Mutant("last partial tile dropped", "forward", "forward_tiled",
           "while n0 < n_end:", "while n0 + uBN <= n_end:", "forward agrees"),
    Mutant("l not rescaled (fa2)", "forward", "forward_fa2",
           "l[a] = alpha * l[a] + row_sum", "l[a] = l[a] + row_sum", "forward agrees"),
    Mutant("row max from this thread's columns only (fa2)", "forward", "forward_fa2",
           "m_new = max(m_new, sm[uR + r * uRR + U(t)])", "m_new = max(m_new, sm[uR + r * uRR + tx])",
           "forward agrees"),
    Mutant("max not guarded on fully masked rows", "forward", "forward_rowwise",
           "if m_new != T(NEG_INF):", "if True:", "forward agrees"),
    Mutant("D left out of dS", "backward", "backward",
           "p * (dp[a, b] - D_t[r])", "p * dp[a, b]", "backward agrees"),
    Mutant("D left out of dS^T (fa2)", "backward", "backward_fa2",
           "ds = p * (dp[a, b] - sm[uDv + il])", "ds = p * dp[a, b]", "backward agrees"),
    Mutant("dQ added without scale (fa2-atomic)", "backward", "backward_fa2",
           "dq_acc[a, e * CHUNK + cc] * scale)", "dq_acc[a, e * CHUNK + cc])",
           "backward agrees", (("dq_atomic", True),)),
    Mutant("P recomputed without lse", "backward", "backward",
           "p = math.exp(s[a, b] - lse_i)", "p = math.exp(s[a, b])", "backward agrees"),
)}


def build(mutant):
    """The kernel module with the mutant's edit applied, as a fresh module object."""
    module = importlib.import_module(f"{kernels.__name__}.{mutant.module}")
    source = inspect.getsource(module)
    count = source.count(mutant.original)
    if count != 1:
        raise RuntimeError(f"mutant {mutant.name!r}: {mutant.original!r} occurs {count} times "
                           f"in {module.__name__}; update the mutant")
    mod = types.ModuleType(f"{module.__name__}_mutant")
    mod.__package__ = kernels.__name__
    mod.__file__ = module.__file__
    code = compile(source.replace(mutant.original, mutant.mutated),
                   f"<mutant {mutant.name}: {module.__name__}>", "exec")
    exec(code, mod.__dict__)
    return mod


@contextlib.contextmanager
def registered(name):
    """Register mutant `name` as a kernel variant; yields the variant's name."""
    mutant = MUTANTS[name]
    mod = build(mutant)
    variant = f"mutant: {name}"
    if mutant.kind == "forward":
        kernels.register_forward(variant, mod.make_forward_kernel, mod.default_blocks)
        table = kernels.FORWARD
    else:
        kernels.register_backward(variant, functools.partial(mod.run_backward,
                                                             **dict(mutant.options)),
                                  mod.default_blocks)
        table = kernels.BACKWARD
    try:
        yield variant
    finally:
        table.pop(variant, None)
