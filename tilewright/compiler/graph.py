"""The kernel graph: what an ATen FX graph becomes before kernels are chosen.

A :class:`KernelGraph` is an ordered list of nodes over named values (FX node names):

* a kind's own kernel node (the GEMM kind's :class:`~tilewright.kinds.gemm.node.GemmNode`:
  one GEMM-family op with its fused epilogue; sizes are sympy expressions so symbolic dims flow
  through): a :class:`Node` with ``launches_kernel`` set, which answers the graph and the
  wrapper through :meth:`Node.produces`, :meth:`Node.describe` and :meth:`Node.wrapper_lines`;
* :class:`LoopNode`: one pointwise or reduction op lowered to the expression IR
  (:mod:`tilewright.ir`), before fusion;
* :class:`FusedNode`: after fusion, a group of loop nodes as one loop kernel;
* :class:`KernelNode`: a kernel of any other registered problem kind (grouped GEMM, ...;
  :mod:`tilewright.kinds`), made by that kind's ``lower`` hook: the wrapper calls it as
  ``outputs = name(*args)``;
* :class:`ExternNode`: any other FX node, run as the ATen call it already is. ``kind`` says
  what it is ("pointwise", "view", "reduction", "attention", "extern") for reports.

Every node keeps the FX nodes it stands for, so the graph can always fall back to ATen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import networkx as nx
import sympy
import torch
import torch.fx as fx

from tilewright._moved import moved_names


def to_sympy(x: Any) -> sympy.Expr:
    """An int or SymInt as a sympy expression."""
    if isinstance(x, torch.SymInt):
        return x.node.expr
    return sympy.Integer(int(x))


# what a data-dependent size (unbacked: nonzero, a boolean mask) counts as in estimates; it is
# never a problem size, since nodes with such sizes stay ATen's (Inductor's fallback is the same)
UNBACKED_HINT = 8192


def size_hint(x: Any) -> int:
    """The concrete value a (possibly symbolic) size had when the graph was traced
    (:data:`UNBACKED_HINT` for a data-dependent one)."""
    if isinstance(x, torch.SymInt):
        hint = x.node.hint
        if hint is not None:
            return int(hint)
        env = x.node.shape_env
        if hasattr(env, "optimization_hint"):  # torch >= 2.13
            return int(env.optimization_hint(x.node.expr, fallback=UNBACKED_HINT))
        value = env.size_hint(x.node.expr, allow_none=True)
        return int(value) if value is not None else UNBACKED_HINT
    return int(x)


def _data_dependent(val: torch.Tensor) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return any(isinstance(s, torch.SymInt) and free_unbacked_symbols(s) for s in (*val.shape, *val.stride()))


@dataclass(frozen=True)
class TensorMeta:
    """Shape, strides (sympy), dtype and device of a tensor value, from FX ``meta['val']``."""

    shape: tuple[sympy.Expr, ...]
    stride: tuple[sympy.Expr, ...]
    hint_shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    # trace-time strides: a strided input's stride can be a size symbol of its own (Dynamo
    # gives a slice's row stride one), whose value no shape holds
    hint_stride: tuple[int, ...] = ()

    @staticmethod
    def of(node: Any) -> "TensorMeta | None":
        """The meta of a tensor-valued node; None for other values and for tensors with a
        data-dependent size (``nonzero``, boolean masks), which stay ATen's to run."""
        val = node.meta.get("val") if isinstance(node, fx.Node) else None
        if not isinstance(val, torch.Tensor) or _data_dependent(val):
            return None
        return TensorMeta(tuple(to_sympy(s) for s in val.shape),
                          tuple(to_sympy(s) for s in val.stride()),
                          tuple(size_hint(s) for s in val.shape), val.dtype, val.device,
                          tuple(size_hint(s) for s in val.stride()))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def symbolic(self) -> bool:
        return any(s.free_symbols for s in self.shape)


def layout_of(meta: TensorMeta) -> str:
    """"row" when the last dim is contiguous, "col" when the one before it is, else "strided"."""
    if meta.stride[-1] == 1 or meta.shape[-1] == 1:
        return "row"
    if meta.stride[-2] == 1 or meta.shape[-2] == 1:
        return "col"
    return "strided"


@dataclass
class Node:
    """A node of the kernel graph. A kind whose kernels need more than :class:`KernelNode`
    subclasses it with ``launches_kernel`` set and answers the shared passes through
    :meth:`produces`, :meth:`describe` and :meth:`wrapper_lines` (the compiler never names it)."""

    name: str
    fx_nodes: list[fx.Node]
    # the wrapper calls a compiled kernel for it (:attr:`KernelGraph.kernels`)
    launches_kernel: ClassVar[bool] = False

    @property
    def inputs(self) -> list[str]:
        raise NotImplementedError

    def produces(self) -> list[str]:
        """The graph values the node computes."""
        return [self.name]

    def describe(self) -> str:
        """One line for :meth:`KernelGraph.describe` (debug dumps)."""
        return f"{self.name} = {type(self).__name__}({', '.join(self.inputs)})"

    def wrapper_lines(self, wrapper: Any) -> list[str]:
        """The wrapper's lines calling this node's kernel, written with ``wrapper``'s names
        (:class:`~tilewright.compiler.wrapper.WrapperCodegen`: ``name``, ``literal``, ``describe``).

        Raises:
            NotImplementedError: the node is no kernel of a kind's own node type.
        """
        raise NotImplementedError(f"{type(self).__name__} {self.name} has no wrapper call")


@dataclass
class ExternNode(Node):
    """An FX node executed as its ATen call."""

    kind: str = "extern"

    @property
    def fx_node(self) -> fx.Node:
        return self.fx_nodes[0]

    @property
    def inputs(self) -> list[str]:
        return [n.name for n in self.fx_node.all_input_nodes]


@dataclass(frozen=True)
class Scatter:
    """What a scatter loop node writes (index_put, scatter, scatter_add/reduce, index_add, the
    embedding's backward): for each point of its ``ranges`` its body's value goes to element
    ``index`` (expressions of the node's variables and of ``ind0, ind1, ...``, whose values are
    ``indirect``) of the value ``target`` (which it starts as; a loop node the scheduler keeps
    in memory and never puts in the scatter's kernel), written, or combined by ``accumulate``
    ("add", "max", "min"). The node's own value is the target after the writes: complete only
    when its kernel has ended, so nothing in that kernel reads it."""

    target: str
    index: tuple[sympy.Expr, ...]
    indirect: tuple[Any, ...]  # tilewright.ir.expr.Node
    accumulate: str | None = None


@dataclass
class LoopNode(Node):
    """One op lowered to the expression IR: value ``name`` at output index ``(i0, i1, ...)``
    (:func:`tilewright.ir.index.variables` ``("i", n)``), reducing over ``(j0, ...)`` when
    ``reduction_ranges`` is not empty (the body is then independent of the ``j``: it holds a
    ``reduce``). A *scan* (cumsum, cummax, ...) is a row op too: its ``reduction_ranges`` are the
    one scanned dim, ``scan_dim`` says which output dim that is, and its body reads the row at
    ``j0`` there (the output index ``i{scan_dim}`` is that same position). ``meta`` gives the
    layout eager would give the value, which is the layout it gets when stored."""

    ranges: tuple[sympy.Expr, ...] = ()
    reduction_ranges: tuple[sympy.Expr, ...] = ()
    body: Any = None  # tilewright.ir.expr.Node
    dtype: str = "fp32"
    meta: TensorMeta | None = None
    scan_dim: int | None = None
    scatter: Scatter | None = None
    # a value that must be in memory (a scatter's target): never recomputed where it is read
    materialize: bool = False

    @property
    def inputs(self) -> list[str]:
        # remembered for the body and scatter it was found for (IR nodes are immutable, so the
        # same objects read the same values): the fusion scheduler asks every node for its
        # inputs at each step, and walking the body each time was most of its time
        memo = self.__dict__.get("_inputs_memo")
        if memo is not None and memo[0] is self.body and memo[1] is self.scatter:
            return list(memo[2])
        from tilewright.ir.expr import loads

        seen: dict[str, None] = {}
        for ld in loads([self.body] + list(self.scatter.indirect if self.scatter else ())):
            seen.setdefault(ld.arg[0], None)
        if self.scatter is not None:
            seen.setdefault(self.scatter.target, None)
        self.__dict__["_inputs_memo"] = (self.body, self.scatter, tuple(seen))
        return list(seen)

    @property
    def value(self) -> str:
        return self.name

    @property
    def is_reduction(self) -> bool:
        """A row op: a reduction or a scan (the scheduler places both by their rows)."""
        return bool(self.reduction_ranges)

    @property
    def is_scan(self) -> bool:
        return self.scan_dim is not None

    @property
    def outer_ranges(self) -> tuple[sympy.Expr, ...]:
        """The dims the row op keeps apart (its rows): a reduction's output dims, a scan's
        output dims but the scanned one."""
        if self.scan_dim is None:
            return self.ranges
        return self.ranges[:self.scan_dim] + self.ranges[self.scan_dim + 1:]


@dataclass
class FusedNode(Node):
    """A group of loop nodes compiled as one loop kernel. ``kernel`` uses canonical names:
    buffer ``in{k}`` is graph value ``args[k]``, ``out{k}`` is ``outputs[k]``, size symbol
    ``z{k}`` is graph symbol ``symbols[k]``; ``problem`` is the kernel at the trace-time sizes."""

    kernel: Any = None  # tilewright.ir.kernel.LoopKernel
    problem: Any = None  # tilewright.problem.LoopProblem
    args: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    symbols: list[sympy.Symbol] = field(default_factory=list)
    members: list[str] = field(default_factory=list)  # the loop nodes it computes
    device: torch.device = torch.device("cpu")
    launches_kernel: ClassVar[bool] = True

    @property
    def inputs(self) -> list[str]:
        return list(self.args)

    def produces(self) -> list[str]:
        return list(self.outputs)


@dataclass
class KernelNode(Node):
    """One kernel of a registered problem kind that needs no node type of its own (loop kernels
    have :class:`FusedNode`, GEMMs :class:`~tilewright.kinds.gemm.node.GemmNode`): ``problem``
    at its trace-time sizes (dynamic ones at their bucket), chosen and built by the pipeline like
    every kernel. The wrapper calls it as ``outputs = name(*args)``: each arg an FX node (a graph
    value) or a literal."""

    kind: str = ""
    problem: Any = None
    args: list[Any] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    device: torch.device = torch.device("cpu")
    launches_kernel: ClassVar[bool] = True

    @property
    def inputs(self) -> list[str]:
        seen: dict[str, None] = {}
        for a in self.args:
            for x in (a if isinstance(a, (list, tuple)) else [a]):
                if isinstance(x, fx.Node):
                    seen.setdefault(x.name, None)
        return list(seen)

    def produces(self) -> list[str]:
        return list(self.outputs)


@dataclass
class KernelGraph:
    """Nodes in execution order, the graph's inputs (placeholders) and its output FX node."""

    placeholders: list[fx.Node]
    nodes: list[Node]
    output: fx.Node

    @property
    def gemms(self) -> list[Node]:
        """Deprecated: :func:`tilewright.kinds.gemm.node.gemm_nodes` (the GEMM kind's)."""
        import importlib
        import warnings

        warnings.warn("KernelGraph.gemms moved to tilewright.kinds.gemm.node.gemm_nodes(kg) (KernelGraph.gemms "
                      "is removed in the next release)", DeprecationWarning, stacklevel=2)
        return importlib.import_module("tilewright.kinds.gemm.node").gemm_nodes(self)

    @property
    def fused(self) -> list[FusedNode]:
        return [n for n in self.nodes if isinstance(n, FusedNode)]

    @property
    def kernels(self) -> list[Node]:
        """Every node the wrapper calls a compiled kernel for, in order."""
        return [n for n in self.nodes if n.launches_kernel]

    def producers(self) -> dict[str, Node]:
        """Value name -> the node that computes it."""
        out: dict[str, Node] = {}
        for n in self.nodes:
            for v in produced(n):
                out[v] = n
        return out

    def dependency_graph(self) -> nx.DiGraph:
        """Edges producer → consumer between nodes (and from placeholder names)."""
        g = nx.DiGraph()
        produced = self.producers()
        for p in self.placeholders:
            g.add_node(p.name)
        for n in self.nodes:
            g.add_node(n.name)
            for v in n.inputs:
                src = produced.get(v)
                g.add_edge(src.name if src is not None else v, n.name)
        return g

    def describe(self) -> str:
        """Human-readable listing, for debug dumps."""
        lines = [f"inputs: {', '.join(p.name for p in self.placeholders)}"]
        for n in self.nodes:
            if isinstance(n, LoopNode):
                from tilewright.ir.expr import render

                red = f" reduce {list(n.reduction_ranges)}" if n.reduction_ranges else ""
                lines.append(f"{n.name} = loop {list(n.ranges)}{red}: {render(n.body, 8)}")
            elif isinstance(n, FusedNode):
                lines.append(f"{', '.join(n.outputs)} = {n.name}({', '.join(n.args)}) "
                             f"[{', '.join(map(str, n.symbols))}] computes {n.members}")
                lines.extend("    " + line for line in n.kernel.describe().splitlines())
            elif isinstance(n, KernelNode):
                lines.append(f"{', '.join(n.outputs)} = {n.name}: {n.kind} {n.problem.describe()} "
                             f"inputs: {n.inputs} absorbs: {[f.name for f in n.fx_nodes]}")
            elif isinstance(n, ExternNode):
                lines.append(f"{n.name} = {n.kind}: {n.fx_node.target}({', '.join(n.inputs)})")
            else:  # a kind's own node
                lines.append(n.describe())
        lines.append(f"outputs: {self.output.args}")
        return "\n".join(lines)


def produced(n: Node) -> list[str]:
    """The graph values a node computes."""
    return n.produces()


# the GEMM kind's names, kept here for one release
__getattr__ = moved_names(__name__, {"FusedInput": "tilewright.kinds.gemm.lower",
                                     "GemmNode": "tilewright.kinds.gemm.node"})
