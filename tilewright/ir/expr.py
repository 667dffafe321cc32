"""The expression IR: what a kernel computes for one element of its iteration space.

A :class:`Node` is one value: ``op`` says what it is, ``src`` its operands, ``arg`` the op's
static argument, ``dtype`` its element type (:mod:`tilewright.ir.dtypes`). Nodes are immutable
and hash-consed (tinygrad's UOp idea): building the same node twice returns the same object, so
a DAG shares common subexpressions by construction, identity is equality, and emitters CSE by
object identity.

The ops:

* ``const``   arg = the value (bool, int or float, NaN and infinities included)
* ``load``    arg = (buffer name, index, masked): the element of a named tensor at a *logical*
              index, a tuple of sympy expressions of the iteration variables, one per tensor
              dim; strides are applied only when code is emitted. ``src`` = (mask,) when
              ``masked`` (a load that only happens where the boolean mask is true, 0 elsewhere),
              then the *indirect* indices: integer nodes the index refers to as the symbols
              ``ind0, ind1, ...`` (gather, embedding: an index that is data).
* ``index``   arg = a sympy expression: the value of an index expression (iota, positions)
* ``acc``     the GEMM accumulator (fp32), the input of a GEMM epilogue
* ``checked`` ``src`` = (value, bound[, mask]): an integer index ``value`` passed through
              unchanged, carrying the bound it must satisfy, ``0 <= value < bound`` (``bound`` an
              ``index`` node: the extent of the dim of the *view* a gather reads, or of the dim a
              one-hot scatter writes); where ``mask`` is given, only its lanes are checked (a
              ``cat`` part or combo kernel share whose other lanes read 0). Emitters report a
              value outside the bound as eager's IndexError (:func:`checked`,
              :mod:`tilewright.ir.bounds`).
* ``cast``    arg = explicit: convert ``src[0]`` to ``dtype``. An explicit cast (the model's own
              ``.to()``) rounds; the casts lowering inserts to compute narrow floats in fp32 and
              back (``explicit=False``) cancel when they meet, as eager's fused kernels and
              Inductor's do not round between ops of one kernel either.
* ``reduce``  arg = kind (:data:`tilewright.ir.ops.REDUCTIONS`): ``src[0]`` reduced over the
              kernel's reduction variables; the result no longer depends on them.
* ``scan``    arg = kind (:data:`tilewright.ir.ops.SCANS`): the inclusive prefix of ``src[0]``
              along the kernel's row (its reduction variables, row-major) up to this element
              (cumsum, cumprod, logcumsumexp, cummax/cummin and their indices). Unlike a
              reduction its value still varies along the row: one per element.
* any name in :data:`tilewright.ir.ops.OPS`: a pointwise op on ``src``.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any, Callable, Iterable, Iterator

import sympy

from tilewright.ir import dtypes
from tilewright.ir.ops import OPS, REDUCTIONS, SCANS, result_dtype

_table: "weakref.WeakValueDictionary[tuple, Node]" = weakref.WeakValueDictionary()
_lock = threading.Lock()


def _key(arg: Any) -> Any:
    """A hashable, exact key for an ``arg``: floats by repr (so -0.0, 0.0 and NaN differ and
    NaN matches itself), tuples element-wise."""
    if isinstance(arg, float):
        return ("float", repr(arg))
    if isinstance(arg, tuple):
        return tuple(_key(a) for a in arg)
    return arg


class Node:
    """One value of the expression IR (see the module docstring). Build nodes with the
    functions below, not directly."""

    __slots__ = ("op", "dtype", "src", "arg", "__weakref__")
    op: str
    dtype: str
    src: tuple["Node", ...]
    arg: Any

    def __new__(cls, op: str, dtype: str, src: tuple["Node", ...] = (), arg: Any = None) -> "Node":
        # children are kept alive by their parent, so their ids are stable while it is interned
        key = (op, dtype, tuple(id(s) for s in src), _key(arg))
        with _lock:
            node = _table.get(key)
            if node is None:
                node = object.__new__(cls)
                object.__setattr__(node, "op", op)
                object.__setattr__(node, "dtype", dtype)
                object.__setattr__(node, "src", tuple(src))
                object.__setattr__(node, "arg", arg)
                _table[key] = node
        return node

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("IR nodes are immutable")

    def __reduce__(self):
        return (Node, (self.op, self.dtype, self.src, self.arg))

    def __repr__(self) -> str:
        return f"<{self.op}:{self.dtype} {render(self)}>"

    # -- arithmetic sugar, so lowering rules read like the math --------------------------------
    def __add__(self, o: Any) -> "Node":
        return op("add", self, lift(o, self.dtype))

    def __radd__(self, o: Any) -> "Node":
        return op("add", lift(o, self.dtype), self)

    def __sub__(self, o: Any) -> "Node":
        return op("sub", self, lift(o, self.dtype))

    def __rsub__(self, o: Any) -> "Node":
        return op("sub", lift(o, self.dtype), self)

    def __mul__(self, o: Any) -> "Node":
        return op("mul", self, lift(o, self.dtype))

    def __rmul__(self, o: Any) -> "Node":
        return op("mul", lift(o, self.dtype), self)

    def __truediv__(self, o: Any) -> "Node":
        return op("truediv", self, lift(o, self.dtype))

    def __rtruediv__(self, o: Any) -> "Node":
        return op("truediv", lift(o, self.dtype), self)

    def __neg__(self) -> "Node":
        return op("neg", self)

    @property
    def is_reduce(self) -> bool:
        return self.op == "reduce"

    @property
    def is_scan(self) -> bool:
        return self.op == "scan"


# -- constructors -----------------------------------------------------------------------------
def const(value: Any, dtype: str) -> Node:
    """A constant of ``dtype``; the value is normalised to the dtype's Python type."""
    if dtype == "bool":
        value = bool(value)
    elif dtypes.is_int(dtype):
        value = int(value)
    else:
        value = float(value)
    return Node("const", dtype, (), value)


def lift(x: Any, dtype: str) -> Node:
    """``x`` itself when it is a node, else a constant of ``dtype``."""
    return x if isinstance(x, Node) else const(x, dtype)


def load(name: str, index: Iterable[Any], dtype: str, mask: Node | None = None,
         indirect: tuple[Node, ...] = ()) -> Node:
    """Element ``index`` (one sympy expression per dim) of tensor ``name``; where ``mask`` is
    false, 0 and no memory access. ``indirect`` are the values of the symbols ``ind0, ...`` the
    index may use."""
    idx = tuple(sympy.sympify(i) for i in index)
    if mask is not None and mask.op == "const":
        if not mask.arg:
            return const(0, dtype)
        mask = None
    src = ((mask,) if mask is not None else ()) + tuple(indirect)
    return Node("load", dtype, src, (name, idx, mask is not None))


def load_mask(n: Node) -> Node | None:
    """The mask of a load node, or None."""
    return n.src[0] if n.arg[2] else None


def load_indirect(n: Node) -> tuple[Node, ...]:
    """The indirect index values of a load node (the values of ``ind0, ind1, ...``)."""
    return n.src[1:] if n.arg[2] else n.src


def checked(value: Node, size: Any, mask: Node | None = None) -> Node:
    """``value`` (an integer index, as i64) with the bound it must satisfy, ``0 <= value <
    size`` (``size`` a sympy expression of the kernel's sizes): the lowering of a gather wraps
    each gathered index in one, bounded by the extent of the dim it indexes in the tensor the
    user indexed (a view's, which the buffer's dim behind it may exceed: ``w[:3][i]``). Every
    emitter checks it where it is computed unless it is proven in range
    (:func:`tilewright.ir.bounds.check_needed`); ``mask``: only the lanes where it holds."""
    value = cast(value, "i64")
    if value.op == "checked" and mask is None and len(value.src) == 2:
        inner = sympy.sympify(value.src[1].arg)
        if inner == sympy.sympify(size):
            return value
    src = (value, index(size, "i64")) + ((mask,) if mask is not None else ())
    return Node("checked", "i64", src, None)


def checked_mask(n: Node) -> Node | None:
    """The mask of a ``checked`` node (the lanes it is checked on), or None: every lane."""
    return n.src[2] if len(n.src) > 2 else None


def indirect_symbol(k: int) -> sympy.Symbol:
    return sympy.Symbol(f"ind{k}", integer=True)


def index(expr: Any, dtype: str = "i64") -> Node:
    """The value of an index expression, as an integer (or, cast later, a float)."""
    return Node("index", dtype, (), sympy.sympify(expr))


def acc() -> Node:
    """The fp32 GEMM accumulator (input of an epilogue)."""
    return Node("acc", "fp32")


def cast(x: Node, dtype: str, explicit: bool = False) -> Node:
    """``x`` converted to ``dtype``. Implicit casts (compute-type bookkeeping) cancel: casting
    an implicitly narrowed value back to its compute type gives the unrounded value."""
    if x.dtype == dtype:
        return x
    if x.op == "cast" and not x.arg and x.src[0].dtype == dtype:
        return x.src[0]
    if x.op == "const":
        return const(x.arg, dtype) if not (dtypes.is_int(dtype) and isinstance(x.arg, float)
                                          and not math.isfinite(x.arg)) else Node("cast", dtype, (x,), explicit)
    return Node("cast", dtype, (x,), bool(explicit))


def op(name: str, *args: Node) -> Node:
    """Pointwise op ``name`` (:data:`~tilewright.ir.ops.OPS`) on nodes of one compute type.

    Raises:
        KeyError: an unknown op.
        ValueError: the wrong number of operands, or operands of different dtypes where the op
            needs one type (lowering inserts the casts).
    """
    info = OPS[name]
    srcs = tuple(args)
    ts = [s.dtype for s in srcs]
    operands = ts[1:] if name == "where" else ts
    if len(set(operands)) > 1:
        raise ValueError(f"op {name} on mixed dtypes {ts}: cast the operands first")
    if name == "where" and ts[0] != "bool":
        raise ValueError(f"where's condition must be bool, not {ts[0]}")
    return Node(name, result_dtype(name, ts), srcs, None)


def where(cond: Node, a: Any, b: Any) -> Node:
    if isinstance(a, Node):
        b = lift(b, a.dtype)
    elif isinstance(b, Node):
        a = lift(a, b.dtype)
    return op("where", cond, a, b)


def reduce(kind: str, x: Node, dtype: str | None = None) -> Node:
    """``x`` reduced over the reduction variables (argmax/argmin give int64 positions in the
    flattened reduction space)."""
    if kind not in REDUCTIONS:
        raise ValueError(f"unknown reduction {kind!r}; known: {REDUCTIONS}")
    if dtype is None:
        dtype = "i64" if kind in ("argmax", "argmin") else "bool" if kind in ("any", "all") else x.dtype
    return Node("reduce", dtype, (x,), kind)


def scan(kind: str, x: Node) -> Node:
    """The inclusive prefix ``kind`` (:data:`~tilewright.ir.ops.SCANS`) of ``x`` along the row
    (argmax/argmin give int64 positions in the row, as cummax/cummin's indices)."""
    if kind not in SCANS:
        raise ValueError(f"unknown scan {kind!r}; known: {SCANS}")
    return Node("scan", "i64" if kind in ("argmax", "argmin") else x.dtype, (x,), kind)


# -- traversal --------------------------------------------------------------------------------
def toposort(roots: Iterable[Node], stop: Callable[[Node], bool] | None = None) -> list[Node]:
    """Every node reachable from ``roots``, operands before users, each once; the operands of a
    node for which ``stop`` is true are not visited (it is, itself)."""
    out: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(r, False) for r in reversed(list(roots))]
    while stack:
        node, expanded = stack.pop()
        if id(node) in seen:
            continue
        if expanded:
            seen.add(id(node))
            out.append(node)
            continue
        stack.append((node, True))
        if stop is not None and stop(node):
            continue
        for s in reversed(node.src):
            if id(s) not in seen:
                stack.append((s, False))
    return out


def loads(roots: Iterable[Node]) -> Iterator[Node]:
    return (n for n in toposort(roots) if n.op == "load")


def rewrite(roots: list[Node], fn: Callable[[Node, tuple[Node, ...]], Node | None]) -> list[Node]:
    """Rebuild the DAG bottom-up: ``fn(node, new_src)`` returns a replacement, or None to keep
    the node (rebuilt on its new operands). Shared subexpressions are visited once."""
    done: dict[int, Node] = {}
    for n in toposort(roots):
        src = tuple(done[id(s)] for s in n.src)
        new = fn(n, src)
        if new is None:
            new = n if src == n.src else Node(n.op, n.dtype, src, n.arg)
        done[id(n)] = new
    return [done[id(r)] for r in roots]


def substitute_vars(roots: list[Node], subs: dict[sympy.Symbol, sympy.Expr],
                    simplify: Callable[[sympy.Expr], sympy.Expr] | None = None) -> list[Node]:
    """Replace iteration variables in every load and index expression (simultaneously)."""
    if not subs:
        return roots
    norm = simplify or (lambda e: e)

    def fn(n: Node, src: tuple[Node, ...]) -> Node | None:
        if n.op == "load":
            name, idx, masked = n.arg
            return Node("load", n.dtype, src, (name, tuple(norm(i.xreplace(subs)) for i in idx), masked))
        if n.op == "index":
            return Node("index", n.dtype, src, norm(n.arg.xreplace(subs)))
        return None

    return rewrite(roots, fn)


def free_index_symbols(roots: Iterable[Node]) -> set[sympy.Symbol]:
    """Symbols used by load and index expressions (iteration variables and sizes)."""
    out: set[sympy.Symbol] = set()
    for n in toposort(roots):
        if n.op == "load":
            for i in n.arg[1]:
                out |= i.free_symbols
        elif n.op == "index":
            out |= n.arg.free_symbols
    return out


def render(node: Node, depth: int = 6) -> str:
    """A short human-readable form, for reprs and debug dumps."""
    if node.op == "const":
        return repr(node.arg)
    if node.op == "load":
        name, idx, masked = node.arg
        m = f" if {render(node.src[0], depth - 1)}" if masked else ""
        ind = load_indirect(node)
        where = f" with {', '.join(f'ind{k}={render(v, depth - 1)}' for k, v in enumerate(ind))}" if ind else ""
        return f"{name}[{', '.join(map(str, idx))}]{m}{where}"
    if node.op == "index":
        return f"idx({node.arg})"
    if node.op == "acc":
        return "acc"
    if depth <= 0:
        return "…"
    inner = ", ".join(render(s, depth - 1) for s in node.src)
    if node.op == "cast":
        return f"{node.dtype}({inner})"
    if node.op == "reduce":
        return f"{node.arg}({inner})"
    if node.op == "scan":
        return f"cum{node.arg}({inner})"
    return f"{node.op}({inner})"


# -- serialisation (cache keys, exports) ------------------------------------------------------
def _arg_json(n: Node) -> Any:
    if n.op == "load":
        return [n.arg[0], [str(i) for i in n.arg[1]], n.arg[2]]
    if n.op == "index":
        return str(n.arg)
    if n.op == "const" and isinstance(n.arg, float) and not math.isfinite(n.arg):
        return repr(n.arg)
    return n.arg


def to_json(roots: list[Node]) -> dict[str, Any]:
    """A JSON-able form of a DAG: nodes in topological order, operands by position."""
    order = toposort(roots)
    pos = {id(n): i for i, n in enumerate(order)}
    return {"nodes": [[n.op, n.dtype, [pos[id(s)] for s in n.src], _arg_json(n)] for n in order],
            "roots": [pos[id(r)] for r in roots]}


def from_json(data: dict[str, Any], symbols: dict[str, sympy.Symbol]) -> list[Node]:
    """Inverse of :func:`to_json`; ``symbols`` maps the names used in index expressions."""
    built: list[Node] = []
    for op_name, dtype, src, arg in data["nodes"]:
        srcs = tuple(built[i] for i in src)
        if op_name == "load":
            arg = (arg[0], tuple(sympy.sympify(i, locals=symbols) for i in arg[1]), bool(arg[2]))
        elif op_name == "index":
            arg = sympy.sympify(arg, locals=symbols)
        elif op_name == "const" and isinstance(arg, str):
            arg = float(arg)
        built.append(Node(op_name, dtype, srcs, arg))
    return [built[i] for i in data["roots"]]
