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
from typing import TYPE_CHECKING, Callable, Sequence

from tilewright.ir import expr as E
from tilewright.ir.index import var

if TYPE_CHECKING:
    import torch

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
    """A :class:`~tilewright.kinds.gemm.problem.GemmProblem`'s epilogue as IR: its ``epilogue_ir``, or its
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


def evaluate(value: E.Node, acc: "torch.Tensor", inputs: Sequence["torch.Tensor"] = ()) -> "torch.Tensor":
    """The math of an epilogue expression on tensors, in float64 with every cast to a float
    type dropped (the roundings a lowering records between eager's ops are the kernel's
    business, not the epilogue's meaning).

    Args:
        value: an epilogue expression (:func:`problem_epilogue`).
        acc: the accumulator's values, any shape, float64.
        inputs: epilogue input ``k``'s values at the same elements, shaped like ``acc`` (an
            input's broadcast pattern is the template's own check: ``problem.epilogue_inputs``).

    Raises:
        ValueError: a node an epilogue cannot hold (a reduction, an index, an unknown input).
    """
    import torch

    from tilewright.ir import dtypes
    from tilewright.ir.ops import OPS

    values: dict[E.Node, torch.Tensor] = {}
    for n in E.toposort([value]):
        args = [values[s] for s in n.src]
        if n.op == "acc":
            v = acc.double()
        elif n.op == "const":
            v = torch.tensor(n.arg, dtype=torch.float64 if dtypes.is_float(n.dtype) else
                             torch.bool if n.dtype == "bool" else torch.int64)
        elif n.op == "load":
            name = n.arg[0]
            if not (name[:1] == "e" and name[1:].isdigit() and int(name[1:]) < len(inputs)):
                raise ValueError(f"the epilogue reads {name!r}; {len(inputs)} input(s) were given")
            v = inputs[int(name[1:])].double()
        elif n.op == "cast":
            src = args[0]
            v = src.double() if dtypes.is_float(n.dtype) else src.bool() if n.dtype == "bool" else \
                src.to(torch.int64)
        elif n.op in OPS:
            v = OPS[n.op].torch(*args)
        else:
            raise ValueError(f"an epilogue cannot hold a {n.op!r} node")
        values[n] = v
    return values[value]


def mismatch(problem, fn: Callable[..., "torch.Tensor"], *, samples: int = 512, seed: int = 0) -> str | None:
    """Why ``problem``'s fused epilogue is not ``fn``, or None when it is.

    ``fn(acc, e0, e1, ...)`` is the epilogue a kernel computes, written in torch: ``acc`` the
    GEMM's fp32 product, ``e0, ...`` the epilogue inputs at the same elements (one per
    ``problem.epilogue_inputs``), e.g. ``lambda acc: torch.relu(acc) ** 2`` or
    ``lambda acc, bias: F.gelu(acc + bias)``. Both sides are evaluated in float64, the problem's
    side by :func:`evaluate` (whatever form the problem holds it in: the op list
    ``problem.epilogue`` or the IR ``problem.epilogue_ir``, where relu is
    ``where(lt(acc, 0), 0, acc)`` and eager's intermediate roundings are casts), at ``samples``
    values (accumulators from -8 to 8 and zero, random inputs) and must agree to 1e-9 relative:
    a structural difference (another activation, an input used otherwise, a constant) shows at
    once; roundings of intermediates do not count. It does not check inputs' broadcast
    patterns or dtypes (``problem.epilogue_inputs``), which a template checks itself."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # a template's supports() is asked inside torch.compile, under its fake mode: the values
    # must be real tensors there
    with unset_fake_temporarily(), torch.no_grad():
        return _mismatch(problem, fn, samples, seed)


def _mismatch(problem, fn: Callable[..., "torch.Tensor"], samples: int, seed: int) -> str | None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    half = samples // 2
    acc = torch.cat([torch.linspace(-8.0, 8.0, half, dtype=torch.float64), torch.zeros(1, dtype=torch.float64),
                     torch.randn(samples - half - 1, generator=gen, dtype=torch.float64) * 3])
    inputs = [torch.randn(acc.shape, generator=gen, dtype=torch.float64) for _ in problem.epilogue_inputs]
    text = problem.describe_epilogue() if hasattr(problem, "describe_epilogue") else "its epilogue"
    try:
        want = evaluate(problem_epilogue(problem), acc, inputs)
    except ValueError as e:
        return f"its epilogue ({text}) cannot be evaluated: {e}"
    try:
        got = fn(acc.clone(), *[t.clone() for t in inputs])
    except TypeError as e:
        return f"the pattern cannot take the accumulator and {len(inputs)} epilogue input(s): {e}"
    got = torch.as_tensor(got, dtype=torch.float64).expand_as(want) if not isinstance(got, torch.Tensor) \
        else got.double().expand_as(want)
    same = torch.isclose(got, want.double().expand_as(got), rtol=1e-9, atol=1e-12, equal_nan=True)
    if bool(same.all()):
        return None
    # report where they differ most (relative to the value's size), not where rounding first shows
    gap = ((got - want).abs() / (want.abs() + 1.0)).nan_to_num(nan=float("inf")).masked_fill(same, -1.0)
    i = int(gap.argmax())
    ins = "".join(f", e{k}={t[i].item():.4g}" for k, t in enumerate(inputs))
    return (f"its epilogue is {text}: at acc={acc[i].item():.4g}{ins} it gives "
            f"{want.expand_as(got)[i].item():.6g}, the pattern {got[i].item():.6g}")
