"""The grouped-GEMM kind, "grouped_gemm": :class:`~tilewright.kinds.grouped_gemm.problem.GroupedGemmProblem`
(``torch._grouped_mm``'s four shape cases, MoE experts) with its fused epilogue.

Policy :class:`~tilewright.kinds.grouped_gemm.policy.GroupedGemmPolicy` and its cost estimate
per template (:func:`~tilewright.kinds.grouped_gemm.policy.estimate_for`: the dense model on the
equal GEMMs of the groups that hold rows, or the gemv model for a template whose ``schedule``
is "gemv"), inputs, checks and the float64 reference in
:mod:`tilewright.kinds.grouped_gemm.checks` (tuned on synthetic even offsets), ATen template
``aten.grouped_gemm``.

In a compiled graph: ``aten._grouped_mm`` is retargeted to ``tilewright.grouped_mm`` and its
epilogues folded into it (:mod:`tilewright.kinds.grouped_gemm.lower`, this kind's
:meth:`~GroupedGemmKind.rewrite_fx`), then each such call becomes a
:class:`~tilewright.compiler.graph.KernelNode` whose problem is bucketed on the ragged total (the
token count), chosen, rendered and compiled in the pipeline's stages like every other kernel.
The wrapper calls it as ``out = grouped_gemm_<i>(a, b, offs[, bias])``: the offsets stay a
run-time input on the device. A call whose operands are symbolic in a dim other than the ragged
one stays the op (an ATen-style extern call that tunes on its first call).

Block-scaled ``F.scaled_grouped_mm`` calls are rewritten to ``tilewright.scaled_grouped_mm``
(:mod:`tilewright.kinds.grouped_gemm.lower_scaled`) and become kernel nodes the same way, their
problem's dtype the recipe; the wrapper calls them as ``out = grouped_gemm_<i>(a, b, offs,
a_scale, b_scale[, global_a, global_b])``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from tilewright.autotune.cost_model import CostEstimate
from tilewright.kinds import ProblemKind
from tilewright.kinds.grouped_gemm import checks
from tilewright.kinds.grouped_gemm.policy import GroupedGemmPolicy, estimate_for
from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem
from tilewright.problem import EpilogueInput, EpilogueOp

# which operand dims are the ragged total, per case: (operand index 0 = a, 1 = b, dim)
_RAGGED_DIMS = {"2d3d": ((0, 0),), "2d2d": ((0, 1), (1, 0)), "3d2d": ((1, 1),), "3d3d": ()}


def grouped_gemm_problem(node: Any, vals: list | None = None) -> GroupedGemmProblem:
    """The problem a ``tilewright.grouped_mm`` call tunes, from its traced operands (or ``vals``,
    tensors standing for a, b, offs and bias): the same
    :func:`~tilewright.kernels.grouped.grouped_problem` the op builds at run time (ragged total
    at its bucket, the activation fused by the compiler), the 2d2d group count from ``offs``.

    Raises:
        InvalidInputError: an operand without a traced tensor value.
    """
    import torch.fx as fx

    from tilewright.errors import InvalidInputError
    from tilewright.kernels.grouped import grouped_problem

    from tilewright.kinds.grouped_gemm.lower_scaled import is_scaled

    if is_scaled(node.target):
        return _scaled_problem(node, vals)
    a, b, offs, bias, out_dtype, *rest = node.args
    if vals is None:
        vals = [x.meta.get("val") if isinstance(x, fx.Node) else None for x in (a, b, offs, bias)]
    if vals[0] is None or vals[1] is None:
        raise InvalidInputError(f"grouped GEMM {node.name}: operands without traced values")
    activation = rest[0] if rest else "none"
    glu = rest[1] if len(rest) > 1 else "none"  # the fused gated product: (…, N/2) out
    problem = grouped_problem(vals[0], vals[1], bias=vals[3], activation=activation, out_dtype=out_dtype, glu=glu)
    if problem.case == "2d2d" and vals[2] is not None:
        problem = problem.with_sizes(G=int(vals[2].shape[0]))
    return problem


def _scaled_problem(node: Any, vals: list | None) -> GroupedGemmProblem:
    """The problem of a ``tilewright.scaled_grouped_mm(a, a_scale, b, b_scale, offs, global_a,
    global_b, fmt, out_dtype, activation, glu)`` call (``vals``: tensors standing for a and b)."""
    import torch.fx as fx

    from tilewright.errors import InvalidInputError
    from tilewright.kernels.scaled_grouped import scaled_grouped_problem

    a, _, b, _, _, global_a, _, fmt, out_dtype, activation, glu = node.args
    if vals is None:
        vals = [x.meta.get("val") if isinstance(x, fx.Node) else None for x in (a, b)]
    if vals[0] is None or vals[1] is None:
        raise InvalidInputError(f"scaled grouped GEMM {node.name}: operands without traced values")
    return scaled_grouped_problem(vals[0], vals[1], fmt=fmt, out_dtype=out_dtype, activation=activation,
                                  glu=glu, global_scales=global_a is not None)


def _concrete(val: Any) -> Any:
    """A meta tensor with a traced tensor's sizes and strides at their hints (so a problem can be
    built from it while those sizes are symbolic)."""
    import torch

    from tilewright.compiler.graph import size_hint  # lowering asks this module: import here

    return torch.empty_strided([size_hint(s) for s in val.shape], [size_hint(s) for s in val.stride()],
                               dtype=val.dtype, device="meta")


def _symbolic(x: Any) -> bool:
    import torch

    return isinstance(x, torch.SymInt) and bool(x.node.expr.free_symbols)


def _jit_problem(node: Any) -> GroupedGemmProblem | None:
    """The problem of a lowered ``tilewright.grouped_mm`` call at its trace-time sizes, or None
    when a size other than the ragged total is symbolic (its kernel would be keyed on a size
    that changes) or an operand has no traced value."""
    import torch.fx as fx

    from tilewright.kinds.grouped_gemm.lower_scaled import is_scaled
    from tilewright.kinds.grouped_gemm.problem import case_of

    if is_scaled(node.target):  # a (M_total, K/pack) with only M symbolic, b (G, N, K/pack) static
        a, b = (x.meta.get("val") if isinstance(x, fx.Node) else None for x in (node.args[0], node.args[2]))
        if a is None or b is None or node.meta.get("val") is None or _symbolic(a.shape[1]) or \
                any(_symbolic(s) for s in b.shape):
            return None
        return _scaled_problem(node, [_concrete(a), b])
    vals = [x.meta.get("val") if isinstance(x, fx.Node) else None for x in node.args[:4]]
    if vals[0] is None or vals[1] is None or node.meta.get("val") is None:
        return None
    case = case_of(vals[0].dim(), vals[1].dim())
    ragged = set(_RAGGED_DIMS[case])
    for i, v in enumerate(vals[:2]):
        if any(_symbolic(s) and (i, d) not in ragged for d, s in enumerate(v.shape)):
            return None
    if any(v is not None and any(_symbolic(s) for s in v.shape) for v in vals[2:]):
        return None
    return grouped_gemm_problem(node, [_concrete(v) if v is not None else None for v in vals])


class GroupedGemmKind(ProblemKind):
    names = ("grouped_gemm",)
    problem_type = GroupedGemmProblem

    def examples(self) -> list[GroupedGemmProblem]:
        base = GroupedGemmProblem(case="2d3d", G=4, M=64, N=32, K=48, dtype="bf16", dynamic=frozenset({"M"}))
        act = (EpilogueOp("silu"),)
        return [base] + [dataclasses.replace(base, **change) for change in (
            {"case": "3d3d", "dynamic": frozenset()}, {"G": 8}, {"M": 128}, {"N": 64}, {"K": 16},
            {"dtype": "fp16", "out_dtype": "fp16"}, {"out_dtype": "fp32"}, {"layout_a": "col"},
            {"layout_b": "col"}, {"epilogue": act},
            {"epilogue": (EpilogueOp("add", input=0),), "epilogue_inputs": (EpilogueInput("BN", "bf16"),)},
            {"epilogue_ir": self._sin_ir()}, {"dynamic": frozenset()}, {"glu": "silu"}, {"op": "grouped_mm_x"},
            {"dtype": "mxfp8", "K": 64, "layout_b": "col", "out_dtype": "bf16"},
            {"dtype": "nvfp4", "K": 64, "layout_b": "col", "out_dtype": "bf16", "global_scales": True},
        )]

    @staticmethod
    def _sin_ir() -> str:
        from tilewright.ir import expr as E
        from tilewright.ir.epilogue import dumps

        return dumps(E.op("sin", E.acc()))

    # -- choosing ---------------------------------------------------------------------------------
    def policy(self, name: str, target: Any) -> GroupedGemmPolicy:
        return GroupedGemmPolicy()

    def estimate(self, problem: GroupedGemmProblem, params: Mapping[str, Any], target: Any,
                 template: Any) -> CostEstimate:
        return estimate_for(template, problem, dict(params), target)

    # -- checking (synthetic even, aligned offsets: problem.synthetic_offsets) ---------------------
    def make_inputs(self, problem: GroupedGemmProblem, device: Any, seed: int = 0) -> checks.GroupedInputs:
        return checks.make_inputs(problem, device, seed)

    def poisoned(self, problem: GroupedGemmProblem, device: Any) -> Any:
        return checks.poisoned_output(problem, device)

    def run(self, launch: Callable, x: checks.GroupedInputs, out: Any) -> Any:
        return checks.run(launch, x, out)

    def error(self, problem: GroupedGemmProblem, result: Any, ref: Any, tf32: bool) -> tuple[float, float]:
        return checks.error(problem, result, ref, tf32)

    def reference(self, problem: GroupedGemmProblem, inputs: checks.GroupedInputs, factory: Any) -> Any:
        return checks.reference(problem, inputs)

    # -- the compiler's side (compiler modules imported in the hooks: it imports the registry) --
    def rewrite_fx(self, gm: Any) -> int:
        from tilewright.kinds.grouped_gemm.lower import fuse_epilogues, lower_grouped_mm
        from tilewright.kinds.grouped_gemm.lower_scaled import rewrite_all as rewrite_scaled

        lowered = sum(lower_grouped_mm(node) for node in list(gm.graph.nodes))
        return lowered + fuse_epilogues(gm) + rewrite_scaled(gm)

    def lower(self, node: Any, index: int) -> Any:
        from tilewright.compiler.graph import ExternNode, KernelNode, TensorMeta
        from tilewright.kinds.grouped_gemm.lower import is_ours
        from tilewright.kinds.grouped_gemm.lower_scaled import is_scaled

        scaled = is_scaled(node.target)
        if not (scaled or is_ours(node.target)):
            return None
        # arguments as lower_grouped_mm and lower_scaled leave them: positional (a call written
        # with keywords stays the op)
        problem = _jit_problem(node) if not node.kwargs and len(node.args) >= (11 if scaled else 5) else None
        meta = TensorMeta.of(node)
        if problem is None or meta is None:  # the op tunes itself on its first call
            return ExternNode(node.name, [node], kind="grouped_gemm")
        if scaled:  # the kernels' order: launch(a, b, offs, a_scale, b_scale[, global_a, global_b])
            a, sa, b, sb, offs, ga, gb = node.args[:7]
            args = [a, b, offs, sa, sb] + ([ga, gb] if ga is not None else [])
        else:
            a, b, offs, bias = node.args[:4]
            args = [a, b, offs] + ([bias] if bias is not None else [])
        return KernelNode(f"grouped_gemm_{index}", [node], kind="grouped_gemm", problem=problem, args=args,
                          outputs=[node.name], device=meta.device)

    def capture(self, kg: Any) -> list[tuple[str, Any]]:
        from tilewright.compiler.graph import ExternNode

        # the kernels, and the calls left to the op (tuned on their first call), which
        # `tilewright aot` and `warm` build and tune all the same
        return [(n.name, n.problem if self.owns(n) else grouped_gemm_problem(n.fx_node)) for n in kg.nodes
                if self.owns(n) or (isinstance(n, ExternNode) and n.kind == "grouped_gemm")]

    def call_sizes(self, problem: GroupedGemmProblem, args: tuple) -> dict[str, int]:
        a, b = args[0], args[1]
        ragged = problem.ragged
        if ragged == "M":  # the tokens: a's rows (packed or not)
            return {"M": a.shape[0]}
        if ragged == "K":
            return {"K": a.shape[1]}
        if ragged == "N":
            return {"N": b.shape[1]}
        return {}

    # -- reports and names ----------------------------------------------------------------------
    def describe_short(self, problem: GroupedGemmProblem) -> str:
        return (f"{problem.op} {problem.case} G={problem.G} {problem.M}x{problem.N}x{problem.K} "
                f"{problem.describe_epilogue()}")

    def aot_label(self, problem: GroupedGemmProblem) -> str:
        # the case and group count name it beside the sizes
        p = problem
        return f"{p.op}_{p.case}_g{p.G}_{p.M}x{p.N}x{p.K}_{p.dtype}_{p.stable_hash()[:6]}"

    def warm_problems(self, problem: GroupedGemmProblem) -> list[tuple[str, Any]]:
        return [(f"{problem.M}x{problem.N}x{problem.K}", problem)]


KIND = GroupedGemmKind()
