"""Recognising a loop kernel's computation exactly: patterns over the expression IR.

A Helion template implements one computation (RMSNorm after a residual add, a softmax), with
its roundings. The fusion scheduler hands it a :class:`~tilewright.problem.LoopProblem` whose
stores are DAGs of :mod:`tilewright.ir.expr` nodes; the template may take the problem only if
those DAGs are *its* computation, node for node. A pattern here is a tree of :class:`Pat`:
an op, operand patterns, a dtype, an argument, a capture name (the same name must match the
same node: a shared subexpression) and commutative ops matched in both operand orders.

Casts match by their dtype (a cast to a narrow float rounds wherever it stands; whether
lowering marked it explicit does not change the value), so :func:`up` ("to fp32, if narrow")
and :func:`rounded` ("to ``dtype``, if narrow") spell the roundings a kernel must reproduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import sympy

from tilewright.ir.expr import Node

ANY = object()
COMMUTATIVE = frozenset({"add", "mul", "maximum", "minimum"})
NARROW = ("fp16", "bf16")


@dataclass(frozen=True)
class Pat:
    """One pattern node: ``op`` (None: any), operand patterns ``src``, ``dtype`` and ``arg``
    (ANY: any), a capture ``name``, and a ``test`` on the node (its arg, say)."""

    op: str | None
    src: tuple["Pat", ...] = ()
    dtype: str | None = None
    arg: Any = ANY
    name: str | None = None
    test: Callable[[Node], bool] | None = None
    either: tuple["Pat", ...] = ()  # alternatives: the first that matches


def match(p: Pat, n: Node, env: dict[str, Node]) -> dict[str, Node] | None:
    """The captures of ``p`` matching ``n`` extended from ``env``, or None."""
    if p.either:
        for alt in p.either:
            found = match(alt, n, env)
            if found is not None:
                return _capture(p, n, found)
        return None
    if p.op is not None and n.op != p.op:
        return None
    if p.dtype is not None and n.dtype != p.dtype:
        return None
    if p.arg is not ANY and n.arg != p.arg:
        return None
    if p.test is not None and not p.test(n):
        return None
    if p.name is not None and p.name in env:
        return env if env[p.name] is n else None
    if p.op is None and not p.src:
        return _capture(p, n, env)
    if len(p.src) != len(n.src):
        return None
    orders = [p.src]
    if n.op in COMMUTATIVE and len(p.src) == 2:
        orders.append(p.src[::-1])
    for order in orders:
        found: dict[str, Node] | None = dict(env)
        for sp, sn in zip(order, n.src):
            found = match(sp, sn, found)
            if found is None:
                break
        if found is not None:
            return _capture(p, n, found)
    return None


def _capture(p: Pat, n: Node, env: dict[str, Node]) -> dict[str, Node] | None:
    if p.name is None:
        return env
    if p.name in env:
        return env if env[p.name] is n else None
    return {**env, p.name: n}


# -- building patterns ----------------------------------------------------------------------------
def op(name: str, *src: Pat, dtype: str | None = None, capture: str | None = None) -> Pat:
    return Pat(name, tuple(src), dtype, name=capture)


def load(capture: str, index: tuple[sympy.Expr, ...]) -> Pat:
    """An unmasked, direct load at exactly ``index``, captured (the buffer is read off it)."""
    return Pat("load", (), None, ANY, capture,
               lambda n: n.arg[1] == tuple(index) and not n.arg[2] and not n.src)


def up(p: Pat) -> Pat:
    """``p`` in fp32: a cast to fp32 of a narrow value, or ``p`` itself when it is fp32."""
    narrow = Pat("cast", (p,), "fp32", test=lambda n: n.src[0].dtype in NARROW)
    return Pat(None, either=(narrow, _with_dtype(p, "fp32")))


def rounded(p: Pat, dtype: str) -> Pat:
    """``p`` (an fp32 value) stored as ``dtype``: a cast to it, unless ``dtype`` is fp32."""
    return p if dtype == "fp32" else Pat("cast", (p,), dtype)


def const(test: Callable[[Any], bool] = lambda v: True, capture: str | None = None) -> Pat:
    return Pat("const", (), "fp32", ANY, capture, lambda n: isinstance(n.arg, float) and test(n.arg))


def row_size(rnumel: sympy.Expr) -> Pat:
    """The row length as an fp32 value: an index of the reduction's size cast to fp32, or the
    constant (a mean's divisor)."""
    size = sympy.sympify(rnumel)
    return Pat(None, either=(Pat("cast", (Pat("index", (), None, ANY, None, lambda n: n.arg == size),), "fp32"),
                             const(lambda v: size.is_number and v == float(size))))


def _with_dtype(p: Pat, dtype: str) -> Pat:
    return Pat(p.op, p.src, dtype, p.arg, p.name, p.test, p.either)
