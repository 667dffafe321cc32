"""The wrapper's own cost per kernel call, measured with a null kernel.

Every generated kernel in a compiled graph is called through a
:class:`~tilewright.compiler.dispatch.KernelCall`. Binding it to a launcher that does nothing
isolates what tilewright adds per call: argument handling, the bucket dispatch of a dynamic
size, the output tuple. Inductor's own per-kernel launcher overhead is about 7 µs on a recent
GPU host (tritonbench's measurement of its generated wrappers); a Triton JIT launch itself
(``kernel[grid](...)``) comes on top of either.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import sympy

from tilewright.ir import expr as E
from tilewright.ir.kernel import Buffer, LoopKernel, Store, size_symbol
from tilewright.ir.index import var
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import get_target

INDUCTOR_LAUNCH_US = 7.0  # Inductor's per-kernel launcher cost, tritonbench (recent GPU host)


def _null_problem(dynamic: bool) -> LoopProblem:
    """out0[x0] = in0[x0] + 1 over z0 (dynamic) or 1024 (static) elements."""
    n: sympy.Expr = size_symbol(0) if dynamic else sympy.Integer(1024)
    x0 = var("x", 0)
    value = E.load("in0", (x0,), "fp32") + 1.0
    kernel = LoopKernel((n,), (), (Buffer("in0", "fp32", (n,), (sympy.Integer(1),)),),
                        (Buffer("out0", "fp32", (n,), (sympy.Integer(1),)),),
                        (Store("out0", (x0,), value),))
    sizes = (("z0", 1024),) if dynamic else ()
    return LoopProblem(kernel, sizes, frozenset({"z0"}) if dynamic else frozenset(), "null")


def _per_call_us(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def launch_overhead(calls: int = 20000, repeats: int = 5) -> dict[str, float]:
    """Per-call cost in µs (best of ``repeats`` runs of ``calls`` calls): ``python_call`` (a
    plain call of the null launcher, the floor), ``static`` (a KernelCall with static sizes),
    ``dynamic`` (a KernelCall dispatching a symbolic size to its bucket), each launcher doing
    nothing; ``inductor_reference`` is Inductor's per-kernel figure, for comparison."""
    from tilewright.compiler.dispatch import KernelCall

    sentinel = object()

    def null(*args: Any, outs: Any = None) -> tuple:
        return (sentinel,)

    out: dict[str, float] = {"python_call": _per_call_us(lambda: null(sentinel), calls, repeats)}
    for name, dynamic in (("static", False), ("dynamic", True)):
        problem = _null_problem(dynamic)
        call = KernelCall(f"null_{name}", problem, get_target("cpu"), factory=None)  # type: ignore[arg-type]
        call.bind(problem, null)
        args = (sentinel, 1024) if dynamic else (sentinel,)
        if call(*args) is not sentinel:
            raise AssertionError("the null kernel's output did not come back")
        out[name] = _per_call_us(lambda: call(*args), calls, repeats)
    out["inductor_reference"] = INDUCTOR_LAUNCH_US
    return out
