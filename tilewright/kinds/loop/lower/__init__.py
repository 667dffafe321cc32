"""Lowering ATen ops to the expression IR: one :class:`~tilewright.compiler.graph.LoopNode` per
pointwise or reduction op, views as index maps.

Each FX value the lowering has seen is a :class:`Value`: something that can be loaded at a
logical index. A value computed by a loop node or by any other node (a GEMM, an ATen call, a
graph input) is a :class:`Buffer`; a view is a :class:`View` that rewrites the index and loads
its source, so views never copy and never become nodes (the ATen view call stays in the graph
only for the consumers that are not loop nodes, and disappears when none is left).

Rules are registered per ATen overload (``@lowering(aten.add.Tensor)``) in the modules of this
package; a rule returns the node's value(s), or None to leave the node to ATen (an op it cannot
express for these arguments). Operands are converted to the op's computation type first (torch's
own type promotion, :func:`torch._prims_common.elementwise_dtypes`), narrow floats computed in
fp32, and the result converted to the traced output dtype.
"""

from __future__ import annotations

import operator
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import sympy
import torch
import torch.fx as fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from tilewright.compiler.graph import LoopNode, TensorMeta, to_sympy
from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.ir.index import variables
from tilewright.kinds.loop.lower.unroll import unrolled_reduction

aten = torch.ops.aten
Index = tuple[sympy.Expr, ...]
Promotion = ELEMENTWISE_TYPE_PROMOTION_KIND


class Value:
    """An FX value as loop nodes read it: a logical shape, a dtype, and ``load(index)``."""

    shape: tuple[sympy.Expr, ...]
    dtype: str

    def load(self, index: Sequence[Any], mask: E.Node | None = None, indirect: tuple[E.Node, ...] = ()) -> E.Node:
        """The element at ``index``; ``indirect`` are the values of the symbols ``ind0, ...``
        the index uses (a gather: an index that is data)."""
        raise NotImplementedError

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass
class Buffer(Value):
    """A value in memory (a graph input, the output of a node): loads read it by name."""

    name: str
    shape: tuple[sympy.Expr, ...]
    dtype: str

    def load(self, index: Sequence[Any], mask: E.Node | None = None, indirect: tuple[E.Node, ...] = ()) -> E.Node:
        if len(index) != len(self.shape):
            raise ValueError(f"{self.name}: index {tuple(index)} for shape {self.shape}")
        return E.load(self.name, index, self.dtype, mask, indirect)


@dataclass
class SizeValue(Value):
    """A size of a dynamic graph used as a number (``arange(n) + past_length``: a SymInt
    operand), as a 0-d i64 value: its loads are the size's expression, which the kernel takes
    as a size argument at run time."""

    expr: sympy.Expr
    shape: tuple[sympy.Expr, ...] = ()
    dtype: str = "i64"

    def load(self, index: Sequence[Any], mask: E.Node | None = None, indirect: tuple[E.Node, ...] = ()) -> E.Node:
        return E.index(self.expr, "i64")


@dataclass
class View(Value):
    """``source`` seen through an index map: ``fn(view index) -> source index``."""

    source: Value
    shape: tuple[sympy.Expr, ...]
    fn: Callable[[Index], Index]
    dtype: str = ""

    def __post_init__(self) -> None:
        self.dtype = self.dtype or self.source.dtype

    def load(self, index: Sequence[Any], mask: E.Node | None = None, indirect: tuple[E.Node, ...] = ()) -> E.Node:
        return self.source.load(self.fn(tuple(sympy.sympify(i) for i in index)), mask, indirect)


@dataclass
class Scalar:
    """A Python number (or a 0-d CPU tensor folded to one) operand."""

    value: bool | int | float


class Unsupported(Exception):
    """Raised by a rule that cannot lower this node with these arguments (it stays ATen)."""


Rule = Callable[["LoopLowering", fx.Node, dict[str, Any]], Any]
RULES: dict[Any, Rule] = {}


def lowering(*targets: Any) -> Callable[[Rule], Rule]:
    """Register a rule for these ATen overloads (packets register every overload)."""
    def deco(fn: Rule) -> Rule:
        for t in targets:
            overloads = [getattr(t, o) for o in t.overloads()] if isinstance(t, torch._ops.OpOverloadPacket) else [t]
            for o in overloads:
                RULES[o] = fn
        return fn
    return deco


def bind(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in."""
    schema = node.target._schema  # type: ignore[union-attr]
    out: dict[str, Any] = {}
    args = list(node.args)
    for i, a in enumerate(schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


_lowering = threading.local()  # the shape env of the graph being lowered (is_one asks it)


def is_one(size: Any) -> bool:
    """Whether a (maybe symbolic) size is 1 in every call of the graph: a literal 1, or a
    symbolic size the graph's guards pin to 1 (``y.view(-1, 4)`` of a 4-element ``y`` under
    ``dynamic=True`` is ``(s1//4, 4)`` with ``s1//4 == 1`` guarded when it broadcast)."""
    if size == 1:
        return True
    env = getattr(_lowering, "shape_env", None)
    if env is None or not getattr(size, "free_symbols", None):
        return False
    try:
        return bool(env._maybe_evaluate_static(sympy.Eq(size, 1)) == sympy.true)
    except Exception:  # noqa: BLE001 - a private API: unknown means "not known to be 1"
        return False


def shape_env_of(gm: fx.GraphModule) -> Any:
    """The ShapeEnv of a graph with symbolic sizes (None for a static graph)."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        for x in ((val,) if isinstance(val, torch.SymInt) else getattr(val, "shape", ()) or ()):
            if isinstance(x, torch.SymInt):
                return x.node.shape_env
    return None


def broadcast_index(shape: Sequence[sympy.Expr], out_index: Index) -> Index:
    """Index into a tensor of ``shape`` broadcast to an output indexed by ``out_index``."""
    lead = len(out_index) - len(shape)
    return tuple(sympy.Integer(0) if is_one(s) else out_index[lead + d] for d, s in enumerate(shape))


@dataclass
class LoopLowering:
    """The state of lowering one FX graph: values seen so far and the loop nodes made."""

    values: dict[str, Value | tuple] = field(default_factory=dict)
    nodes: list[LoopNode] = field(default_factory=list)

    # -- values -----------------------------------------------------------------------------------
    def add_buffer(self, node: fx.Node) -> None:
        """Make an FX value computed elsewhere (input, GEMM, ATen call) loadable."""
        meta = TensorMeta.of(node)
        if meta is None or meta.dtype not in dtypes.NAMES:
            return
        self.values[node.name] = Buffer(node.name, meta.shape, dtypes.name_of(meta.dtype))

    def value(self, x: Any) -> Value | Scalar:
        """An argument as a Value or a Scalar.

        Raises:
            Unsupported: the argument is neither (a list, a None, an unknown value).
        """
        if isinstance(x, fx.Node):
            v = self.values.get(x.name)
            if isinstance(v, Value):
                return v
            val = x.meta.get("val")
            if isinstance(val, torch.SymInt) and val.node.hint is not None:
                return SizeValue(to_sympy(val))
            raise Unsupported(f"{x.name} is not a tensor the IR can read")
        if isinstance(x, (bool, int, float)):
            return Scalar(x)
        raise Unsupported(f"argument {x!r}")

    # -- building -----------------------------------------------------------------------------------
    def loop(self, node: fx.Node, body_fn: Callable[[Index], E.Node], name: str | None = None,
             meta: TensorMeta | None = None) -> Buffer:
        """A pointwise loop node for ``node``'s output: ``body_fn(output index) -> value``."""
        meta = meta or TensorMeta.of(node)
        if meta is None:
            raise Unsupported("no tensor metadata")
        idx = variables("i", meta.ndim)
        dtype = dtypes.name_of(meta.dtype)
        body = E.cast(body_fn(idx), dtype)
        name = name or node.name
        self.nodes.append(LoopNode(name, [node], ranges=meta.shape, body=body, dtype=dtype, meta=meta))
        buf = Buffer(name, meta.shape, dtype)
        return buf

    def reduction(self, node: fx.Node, src_shape: Sequence[sympy.Expr], dims: Sequence[int],
                  keepdim: bool, body_fn: Callable[[Index], E.Node], name: str | None = None,
                  meta: TensorMeta | None = None) -> Buffer:
        """A reduction loop node: ``body_fn(source index)`` is what is reduced, over ``dims``
        of ``src_shape``; the body must wrap it in ``reduce`` (see :func:`reduce_over`)."""
        meta = meta or TensorMeta.of(node)
        if meta is None:
            raise Unsupported("no tensor metadata")
        if not src_shape:
            # a 0-d tensor (sum(x, 0), softmax(x, -1), var(x, 0) with a correction ...) reduces
            # its one element: a row of one, so every kind keeps its own meaning (argmax 0, the
            # variance's 0/0 = NaN) and the node fuses like any reduction
            scalar_body = body_fn
            src_shape, dims, body_fn = (sympy.Integer(1),), [0], lambda _index: scalar_body(())
        dims = sorted({d % len(src_shape) for d in dims})
        if not dims:
            raise Unsupported("a reduction over no dim")
        out_idx = variables("i", meta.ndim)
        red_vars = variables("j", len(dims))
        src_index: list[sympy.Expr] = []
        k = 0
        for d in range(len(src_shape)):
            if d in dims:
                src_index.append(red_vars[dims.index(d)])
                if keepdim:
                    k += 1
            else:
                src_index.append(out_idx[k])
                k += 1
        dtype = dtypes.name_of(meta.dtype)
        body = E.cast(body_fn(tuple(src_index)), dtype)
        name = name or node.name
        ranges = tuple(src_shape[d] for d in dims)
        flat = unrolled_reduction(body, red_vars, ranges)
        if flat is not None:  # a short row: a pointwise node, which fuses where a row op cannot
            self.nodes.append(LoopNode(name, [node], ranges=meta.shape, body=flat, dtype=dtype, meta=meta))
        else:
            self.nodes.append(LoopNode(name, [node], ranges=meta.shape, body=body, dtype=dtype, meta=meta,
                                       reduction_ranges=ranges))
        return Buffer(name, meta.shape, dtype)

    def scan(self, node: fx.Node, src_shape: Sequence[sympy.Expr], dim: int,
             body_fn: Callable[[Index], E.Node], name: str | None = None,
             meta: TensorMeta | None = None) -> Buffer:
        """A scan loop node along ``dim`` of ``src_shape`` (the output's shape too):
        ``body_fn(source index)`` is the ``scan`` node, the source index holding ``j0`` at
        ``dim`` and the output's own variables elsewhere."""
        meta = meta or TensorMeta.of(node)
        if meta is None:
            raise Unsupported("no tensor metadata")
        if tuple(meta.shape) != tuple(src_shape):
            raise Unsupported("a scan whose output is not shaped like its input")
        out_idx = variables("i", meta.ndim)
        src_index = out_idx[:dim] + (variables("j", 1)[0],) + out_idx[dim + 1:]
        dtype = dtypes.name_of(meta.dtype)
        body = E.cast(body_fn(src_index), dtype)
        name = name or node.name
        self.nodes.append(LoopNode(name, [node], ranges=meta.shape, body=body, dtype=dtype, meta=meta,
                                   reduction_ranges=(src_shape[dim],), scan_dim=dim))
        return Buffer(name, meta.shape, dtype)

    def output_names(self, node: fx.Node, count: int) -> list[str]:
        """Names for the outputs of a multi-output op: each one is named after the ``getitem``
        node that takes it (so graph outputs and ATen consumers find it), else ``name_k``."""
        names = [f"{node.name}_{k}" for k in range(count)]
        for user in node.users:
            if user.target is operator.getitem and isinstance(user.args[1], int) and user.args[1] < count:
                names[user.args[1]] = user.name
        return names

    def used_outputs(self, node: fx.Node) -> set[int]:
        return {u.args[1] for u in node.users if u.target is operator.getitem and isinstance(u.args[1], int)}

    # -- operands -----------------------------------------------------------------------------------
    def operand(self, x: Value | Scalar, index: Index, dtype: str) -> E.Node:
        """``x`` at the (broadcast) output ``index``, converted to compute dtype ``dtype``."""
        if isinstance(x, Scalar):
            return E.const(x.value, dtype)
        return E.cast(x.load(broadcast_index(x.shape, index)), dtype)


def computation_dtype(node: fx.Node, operands: Sequence[Any], kind: Promotion) -> str:
    """The dtype torch computes ``node`` in (bf16/fp16 -> fp32, as eager's opmath)."""
    examples = []
    for x in operands:
        if isinstance(x, fx.Node):
            val = x.meta.get("val")
            if isinstance(val, torch.SymInt) and val.node.hint is not None:
                examples.append(int(val.node.hint))  # a size operand promotes as the int it is
                continue
            if not isinstance(val, torch.Tensor):
                raise Unsupported(f"{x.name} has no tensor metadata")
            examples.append(val)
        elif isinstance(x, (bool, int, float)):
            examples.append(x)
    compute, _ = elementwise_dtypes(*examples, type_promotion_kind=kind)
    if compute not in dtypes.NAMES:  # complex (abs of an rfft's result): that op stays ATen
        raise Unsupported(f"computing in {compute}, which the IR does not hold")
    return dtypes.compute_type(dtypes.name_of(compute))


def lower_loops(gm: fx.GraphModule, skip: set[str]) -> tuple[dict[str, LoopNode], dict[str, Value | tuple]]:
    """Lower every FX node with a rule (except those in ``skip``, already lowered as GEMMs):
    the loop nodes by name, and the value of every FX node the IR can read."""
    import tilewright.kinds.loop.lower.rules  # noqa: F401 - registers the rules

    ctx = LoopLowering()
    by_name: dict[str, LoopNode] = {}
    _lowering.shape_env = shape_env_of(gm)
    try:
        _lower_each(ctx, gm, skip, by_name)
    finally:
        _lowering.shape_env = None
    return by_name, ctx.values


def _lower_each(ctx: "LoopLowering", gm: fx.GraphModule, skip: set[str], by_name: dict[str, LoopNode]) -> None:
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node.op == "get_attr":
            ctx.add_buffer(node)
            continue
        if node.op != "call_function":
            continue
        if node.name in skip:
            ctx.add_buffer(node)
            continue
        if node.target is operator.getitem:
            parent = ctx.values.get(node.args[0].name) if isinstance(node.args[0], fx.Node) else None
            if isinstance(parent, tuple) and isinstance(node.args[1], int) and parent[node.args[1]] is not None:
                ctx.values[node.name] = parent[node.args[1]]
            else:
                ctx.add_buffer(node)
            continue
        rule = RULES.get(node.target)
        before = len(ctx.nodes)
        result = None
        if rule is not None and _float_or_int_outputs(node) and not _eager_lacks_kernel(node):
            try:
                result = rule(ctx, node, bind(node))
            except Unsupported:
                result = None
            except Exception as e:  # noqa: BLE001 - a rule's bug costs this node (ATen), not the graph
                from tilewright.compiler.fallbacks import contain

                contain(e, node.name, "lower", f"lowering {node.target} to a loop node")
                result = None
        if result is None:
            del ctx.nodes[before:]
            ctx.add_buffer(node)
            continue
        ctx.values[node.name] = result
        for ln in ctx.nodes[before:]:
            by_name[ln.name] = ln


_LACKS: dict[tuple, bool] = {}


def _eager_lacks_kernel(node: fx.Node) -> bool:
    """Whether eager has no CPU kernel for ``node``'s op on its operands' dtypes ("threshold_cpu"
    not implemented for 'Bool'): the node then stays ATen, which raises as eager does, instead
    of a loop kernel computing a value eager refuses to (fuzzer find). Asked once per op and
    dtypes, of one-element tensors shaped like the operands (all dims 1), for CPU graphs."""
    def tiny(x: Any) -> Any:
        if isinstance(x, fx.Node):
            x = x.meta.get("val")
            if isinstance(x, torch.Tensor):
                return torch.zeros((1,) * x.dim(), dtype=x.dtype)
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            # its trace-time value: calling the op on the symbol itself would turn it into a
            # number with a guard, specialising a dynamic graph to this size
            hint = x.node.hint
            return hint if hint is not None else 1
        if isinstance(x, (list, tuple)):
            return type(x)(tiny(v) for v in x)
        return x

    def key(x: Any) -> Any:
        if isinstance(x, fx.Node):
            val = x.meta.get("val")
            return (str(val.dtype), val.dim()) if isinstance(val, torch.Tensor) else ("node", type(val).__name__)
        if isinstance(x, (list, tuple)):
            return tuple(key(v) for v in x)
        return (type(x).__name__, x if isinstance(x, (bool, str, torch.dtype)) else None)

    vals = [a.meta.get("val") for a in node.all_input_nodes]
    if any(isinstance(v, torch.Tensor) and v.device.type != "cpu" for v in vals):
        return False  # asked of the CPU's kernels only: a GPU's cover other dtypes
    try:
        k = (node.target, key(node.args), tuple(sorted((n, key(v)) for n, v in node.kwargs.items())))
        hash(k)
    except TypeError:
        return False
    if k not in _LACKS:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        try:
            # real tensors: under the compile's fake mode the meta kernel answers, and it has no
            # dtype gaps
            with unset_fake_temporarily(), torch.no_grad():
                node.target(*tiny(node.args), **{n: tiny(v) for n, v in node.kwargs.items()})
            _LACKS[k] = False
        except NotImplementedError as e:
            _LACKS[k] = "not implemented for" in str(e)
        except Exception:  # noqa: BLE001 - another complaint about the tiny operands: not our question
            _LACKS[k] = False
    return _LACKS[k]


def _float_or_int_outputs(node: fx.Node) -> bool:
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    return all(v is None or (isinstance(v, torch.Tensor) and v.dtype in dtypes.NAMES) for v in vals) \
        and any(isinstance(v, torch.Tensor) for v in vals)


__all__ = ["is_one", "Buffer", "LoopLowering", "Scalar", "Unsupported", "Value", "View", "bind",
           "broadcast_index", "computation_dtype", "lower_loops", "lowering", "to_sympy"]
