"""The GEMM kind's kernel-graph node: :class:`GemmNode`, one GEMM-family op (mm, addmm, bmm,
baddbmm, scaled_mm, the block-scaled GEMMs, and what linear decomposes to) with its fused
epilogue, as the kind's lowering (:mod:`tilewright.kinds.gemm.lower`) makes it and its fusion
(:mod:`tilewright.kinds.gemm.fuse`) grows it. Sizes are sympy expressions so symbolic dims flow
through. It moved here from ``tilewright.compiler.graph`` (issue 30: a kind is its folder); the
shared passes (wrapper, PDL, traffic) ask it through :class:`~tilewright.compiler.graph.Node`'s
interface (``launches_kernel``, ``produces``, ``describe``, ``wrapper_lines``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import sympy
import torch
import torch.fx as fx

from tilewright.compiler.graph import KernelGraph, Node
from tilewright.problem import EpilogueOp


@dataclass
class GemmNode(Node):
    """A GEMM with its fused epilogue. ``name`` is the kernel's name (gemm_0, gemm_1, ...);
    ``value`` the FX value it produces (the last node it absorbed)."""

    op: str = "mm"
    a: str = ""
    b: str = ""
    M: sympy.Expr = sympy.Integer(0)
    N: sympy.Expr = sympy.Integer(0)
    K: sympy.Expr = sympy.Integer(0)
    batch: sympy.Expr = sympy.Integer(1)
    hints: dict[str, int] = field(default_factory=dict)
    batched: bool = False
    dtype: torch.dtype = torch.float32
    out_dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")
    layout_a: str = "row"
    layout_b: str = "row"
    epilogue: list[EpilogueOp] = field(default_factory=list)
    epilogue_inputs: list[Any] = field(default_factory=list)  # tilewright.kinds.gemm.lower.FusedInput
    view: fx.Node | None = None  # the absorbed view node, whose shape arguments the wrapper uses
    value: str = ""
    # the GEMM's own FX value when it is needed beside the epilogue's (saved for the backward):
    # the kernel stores it too, before the epilogue
    acc_value: str = ""
    acc_after: int = 0  # leading epilogue steps (bias, scales from lowering) the stored value includes
    # the epilogue as expression IR (tilewright.ir.expr.Node) once the chain took an op that is
    # not one of the epilogue kinds; ``epilogue`` is then empty
    epilogue_ir: Any = None
    fmt: str = ""  # block-scaled format ("nvfp4") when A and B are packed with block scales
    scales: tuple[str, str] | None = None  # values of A's and B's block scales
    scale_layout: str = ""
    # ``b`` names w where B is w.t() (a linear's weight; kinds/gemm/transposed.py): the view is
    # not made in the wrapper; the kernel call takes w as it is or makes the view itself
    b_t: bool = False
    launches_kernel: ClassVar[bool] = True

    @property
    def inputs(self) -> list[str]:
        names = [self.a, self.b] + list(self.scales or ()) + [e.value for e in self.epilogue_inputs]
        if self.view is not None:  # a symbolic view shape reads size values of the graph
            names += [n.name for n in self.view.args[1] if isinstance(n, fx.Node)] \
                if isinstance(self.view.args[1], (list, tuple)) else []
        return names

    @property
    def dynamic(self) -> frozenset[str]:
        dims = {"M": self.M, "N": self.N, "K": self.K, "batch": self.batch}
        return frozenset(k for k, v in dims.items() if v.free_symbols)

    def produces(self) -> list[str]:
        return [self.value] + ([self.acc_value] if self.acc_value else [])

    def describe(self) -> str:
        eps = " → ".join(op.describe(tuple(e.pattern for e in self.epilogue_inputs))
                         for op in self.epilogue) or "-"
        return (f"{self.value}{', ' + self.acc_value if self.acc_value else ''} = {self.name}: {self.op} "
                f"batch={self.batch} M={self.M} N={self.N} K={self.K} "
                f"{self.fmt or self.dtype}→{self.out_dtype} A={self.a}({self.layout_a}) "
                f"B={self.b}{'.T' if self.b_t else ''}({self.layout_b}) "
                + (f"scales={list(self.scales)} " if self.scales else "") +
                f"epilogue: {eps} inputs: {[e.value for e in self.epilogue_inputs]} "
                f"absorbs: {[f.name for f in self.fx_nodes]}")

    def wrapper_lines(self, wrapper: Any) -> list[str]:
        """``value[, acc_value] = name(a, b, *epilogue inputs[, a_scale=, b_scale=][, view=])``,
        after the kernel's comment line when ``wrapper.describe`` has one."""
        w = wrapper
        args = [w.name(self.a), w.name(self.b)] + [w.name(e.value) for e in self.epilogue_inputs]
        if self.scales:
            args += [f"a_scale={w.name(self.scales[0])}", f"b_scale={w.name(self.scales[1])}"]
        if self.view is not None:
            args.append(f"view={w.literal(self.view.args[1])}")
        lines = []
        if self.name in w.describe:
            lines.append(f"# {self.name}: {w.describe[self.name]}")
        outs = w.name(self.value) + (f", {w.name(self.acc_value)}" if self.acc_value else "")
        lines.append(f"{outs} = {self.name}({', '.join(args)})")
        return lines


def gemm_nodes(kg: KernelGraph) -> list[GemmNode]:
    """The GEMM nodes of a kernel graph, in graph order."""
    return [n for n in kg.nodes if isinstance(n, GemmNode)]
