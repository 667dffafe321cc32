"""A GEMM's epilogue as an expression of the expression IR, applied to the fp32 accumulator.

Each :class:`~tilewright.problem.EpilogueOp` kind is defined here once, as IR over ``acc`` (the
accumulator, :func:`~tilewright.ir.expr.acc`) and the loads of the epilogue inputs. An input
``k`` is the tensor ``e{k}``, loaded at the output element's logical index in the variables
``b``, ``m``, ``n`` (:func:`~tilewright.ir.index.var`) restricted to the dims its broadcast
pattern spans: a bias (``"N"``) at ``(n,)``, a residual (``"MN"``) at ``(m, n)``, a scalar
tensor at ``()``. Templates render the expression with their language's emitter (Triton:
:mod:`tilewright.templates.triton.epilogue`) instead of interpreting the op list themselves, so
a new activation is one entry in :data:`UNARY`.
"""

from __future__ import annotations

import json
from typing import Callable, Sequence

from tilewright.ir import expr as E
from tilewright.ir.index import var

# unary kinds: x (fp32) -> value. Formulas as eager computes them in fp32.
UNARY: dict[str, Callable[[E.Node], E.Node]] = {
    "relu": lambda x: E.where(E.op("lt", x, E.const(0.0, "fp32")), 0.0, x),
    "gelu": lambda x: 0.5 * x * (1.0 + E.op("erf", x * 0.7071067811865476)),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + E.op("tanh", 0.7978845608028654 * (x + 0.044715 * x * x * x))),
    "silu": lambda x: x / (1.0 + E.op("exp", -x)),
    "sigmoid": lambda x: 1.0 / (1.0 + E.op("exp", -x)),
    "tanh": lambda x: E.op("tanh", x),
}


def input_index(pattern: str) -> tuple:
    """The logical index an epilogue input of broadcast ``pattern`` is loaded at."""
    return tuple(var(d.lower()) for d in pattern)


def input_load(k: int, pattern: str, dtype: str) -> E.Node:
    """Epilogue input ``k`` at the current output element, in fp32."""
    return E.cast(E.load(f"e{k}", input_index(pattern), dtype), "fp32")


def epilogue_expr(ops: Sequence, inputs: Sequence) -> E.Node:
    """The value an epilogue stores (before the cast to the output dtype) for ``ops``
    (:class:`~tilewright.problem.EpilogueOp`) over ``inputs``
    (:class:`~tilewright.problem.EpilogueInput`).

    Raises:
        ValueError: an op kind with no meaning here.
    """
    x = E.acc()
    for op in ops:
        if op.kind in UNARY:
            x = UNARY[op.kind](x)
            continue
        if op.input is not None:
            other = input_load(op.input, inputs[op.input].broadcast, inputs[op.input].dtype)
            if op.scale != 1.0:
                other = other * float(op.scale)
        else:
            other = E.const(float(op.scalar), "fp32")
        if op.kind == "add":
            x = x + other
        elif op.kind == "sub":
            x = other - x if op.reverse else x - other
        elif op.kind == "mul":
            x = x * other
        elif op.kind == "div":
            x = other / x if op.reverse else x / other
        else:
            raise ValueError(f"epilogue kind {op.kind!r} has no IR meaning")
    return x


_SYMBOLS = {"b": var("b"), "m": var("m"), "n": var("n")}


def dumps(value: E.Node) -> str:
    """The canonical JSON of an epilogue expression (a problem's ``epilogue_ir``)."""
    return json.dumps(E.to_json([value]), sort_keys=True, separators=(",", ":"))


def loads(text: str) -> E.Node:
    return E.from_json(json.loads(text), _SYMBOLS)[0]


def problem_epilogue(problem) -> E.Node:
    """A :class:`~tilewright.problem.GemmProblem`'s epilogue as IR: its ``epilogue_ir``, or its
    list of kinds turned into IR."""
    if problem.epilogue_ir:
        return loads(problem.epilogue_ir)
    return epilogue_expr(problem.epilogue, problem.epilogue_inputs)


def swap_mn(text: str) -> str:
    """``epilogue_ir`` with m and n exchanged in every load (the swap-AB problem's)."""
    swap = {_SYMBOLS["m"]: _SYMBOLS["n"], _SYMBOLS["n"]: _SYMBOLS["m"]}
    names = {"b": 0, "m": 1, "n": 2}

    def fn(n: E.Node, src: tuple[E.Node, ...]) -> E.Node | None:
        if n.op != "load":
            return None
        idx = sorted((i.xreplace(swap) for i in n.arg[1]), key=lambda s: names[str(s)])
        return E.Node("load", n.dtype, src, (n.arg[0], tuple(idx), n.arg[2]))
    return dumps(E.rewrite([loads(text)], fn)[0])
