"""The loop-kernel kind, "pointwise" and "reduction": :class:`~tilewright.problem.LoopProblem`,
a fused group of pointwise ops and reductions in the expression IR.

Policy :class:`~tilewright.kinds.loop.policy.LoopPolicy`, cost model
:func:`~tilewright.kinds.loop.cost.estimate_loop`, ATen templates ``aten.pointwise`` and
``aten.reduction`` (the torch emitter; with ``reference=True`` in float64, the reference). Its
kernels are the kernel graph's :class:`~tilewright.compiler.graph.FusedNode`\\ s, which the
fusion scheduler makes (:mod:`tilewright.kinds.loop.fusion.schedule`). Sizes are the kernel's size
symbols (``z0``, ``z1``, ...), passed after the tensors at run time.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import sympy
import torch

from tilewright.autotune.candidates import Candidate
from tilewright.kinds.loop.cost import estimate_loop
from tilewright.kinds import ProblemKind
from tilewright.kinds.loop.checks import (
    LoopInputs, _loop_error, _loop_run, make_loop_inputs, poisoned_loop_outputs, special_loop_inputs,
)
from tilewright.kinds.loop.policy import LoopPolicy
from tilewright.problem import LoopProblem

_aten = torch.ops.aten
# ATen calls that are this kind's when left to ATen (labels for reports, ProblemKind.extern_label)
POINTWISE_OPS = frozenset({
    _aten.add.Tensor, _aten.sub.Tensor, _aten.mul.Tensor, _aten.div.Tensor, _aten.relu.default,
    _aten.gelu.default, _aten.silu.default, _aten.sigmoid.default, _aten.tanh.default,
    _aten._to_copy.default, _aten.clone.default, _aten.neg.default, _aten.exp.default,
    _aten.rsqrt.default, _aten.pow.Tensor_Scalar, _aten.where.self, _aten.add.Scalar, _aten.mul.Scalar,
})
REDUCTION_OPS = frozenset({
    _aten._softmax.default, _aten._log_softmax.default, _aten.native_layer_norm.default,
    _aten.mean.dim, _aten.sum.dim_IntList, _aten.amax.default, _aten.linalg_vector_norm.default,
})

def _example_kernel(reduce: bool, dtype: str = "fp32", stride: int = 1, op: str = "exp") -> Any:
    """``out0[x] = op(in0[x])`` or, reducing, ``out0[x] = sum(in0[x, :])`` (registry tests)."""
    from tilewright.ir import expr as E
    from tilewright.ir.index import var
    from tilewright.ir.kernel import Buffer, LoopKernel, Store, size_symbol

    z0, z1, one = size_symbol(0), size_symbol(1), sympy.Integer(1)
    x0, r0 = var("x", 0), var("r", 0)
    if not reduce:
        value = E.op(op, E.load("in0", (x0,), dtype))
        return LoopKernel((z0,), (), (Buffer("in0", dtype, (z0,), (sympy.Integer(stride),)),),
                          (Buffer("out0", dtype, (z0,), (one,)),), (Store("out0", (x0,), value),))
    value = E.reduce("sum", E.load("in0", (x0, r0), dtype))
    return LoopKernel((z0,), (z1,), (Buffer("in0", dtype, (z0, z1), (z1, one)),),
                      (Buffer("out0", value.dtype, (z0,), (one,)),), (Store("out0", (x0,), value),))


class LoopKind(ProblemKind):
    names = ("pointwise", "reduction")
    problem_type = LoopProblem
    # the ATen ops a kernel replaced (compiler/programs.py): carried, not its identity (the
    # program's candidate key holds its digest)
    display_fields = ("op", "unfused")

    def examples(self) -> list[LoopProblem]:
        base = LoopProblem(_example_kernel(False), (("z0", 40),), frozenset(), "exp")
        return [base,
                LoopProblem(_example_kernel(False, op="sin"), (("z0", 40),), frozenset(), "exp"),
                LoopProblem(_example_kernel(False, stride=2), (("z0", 40),), frozenset(), "exp"),
                LoopProblem(_example_kernel(False, dtype="bf16"), (("z0", 40),), frozenset(), "exp"),
                LoopProblem(_example_kernel(False), (("z0", 48),), frozenset(), "exp"),
                LoopProblem(_example_kernel(False), (("z0", 40),), frozenset({"z0"}), "exp"),
                LoopProblem(_example_kernel(False), (("z0", 40),), frozenset(), "exp_again"),
                LoopProblem(_example_kernel(False), (("z0", 40),), frozenset(), "exp",
                            '{"native": [], "outputs": [0], "static": [], "steps": []}'),
                LoopProblem(_example_kernel(True), (("z0", 6), ("z1", 30)), frozenset(), "sum")]

    # -- the compiler's side ----------------------------------------------------------------------
    def rewrite_fx(self, gm: Any) -> int:
        """MX activation quantisations get their scales as bytes (a free view back to E8M0),
        so a loop kernel can write them (lower/quantize_mx.py)."""
        from tilewright.kinds.loop.lower.quantize_mx import expose_scale_bytes

        return expose_scale_bytes(gm)

    def schedule(self, kg: Any, gm: Any) -> int:
        """The fusion scheduler (:func:`tilewright.kinds.loop.fusion.schedule.schedule`): the
        graph's loop nodes grouped into loop kernels, each a ``FusedNode``."""
        from tilewright.kinds.loop.fusion.schedule import schedule  # the compiler's layer, above this one

        return schedule(kg, gm)

    # -- choosing ---------------------------------------------------------------------------------
    def policy(self, name: str, target: Any) -> LoopPolicy:
        return LoopPolicy(name)

    def estimate(self, problem: LoopProblem, params: Mapping[str, Any], target: Any, template: Any) -> Any:
        return estimate_loop(problem, params, target)

    # -- checking ---------------------------------------------------------------------------------
    def make_inputs(self, problem: LoopProblem, device: Any, seed: int = 0) -> LoopInputs:
        return make_loop_inputs(problem, device, seed)

    def poisoned(self, problem: LoopProblem, device: Any) -> tuple[torch.Tensor, ...]:
        return poisoned_loop_outputs(problem, device)

    def run(self, launch: Callable, x: LoopInputs, outs: Any) -> tuple[torch.Tensor, ...]:
        return _loop_run(launch, x, outs)

    def run_timed(self, launch: Callable, x: LoopInputs, outs: Any) -> tuple[torch.Tensor, ...]:
        """On a CPU, a kernel with no scatter is timed allocating its outputs, as
        :meth:`invoker`'s call does (``launch(*args)``); else into ``outs``. Timed into
        ``outs``, an ATen candidate (``aten.unfused_reduction``: ``torch.softmax``) paid a copy
        of its result the graph never makes, while a generated kernel wrote into warm, already
        faulted-in buffers: measured on softmax fp32 1024x1024 (one thread, interleaved), ATen
        1.06 ms into ``outs`` vs 0.63 ms allocating, the C++ kernel 0.84 vs 0.78, so the tuner
        picked the C++ kernel that runs 1.2x eager's time in the graph. A scatter's graph call
        writes into its input, which the timed runs must not (the tuner checks inputs stay
        unchanged), and on a GPU this is not measured yet: those keep ``outs``."""
        if x.scatters or any(isinstance(o, torch.Tensor) and o.device.type != "cpu" for o in outs):
            return _loop_run(launch, x, outs)
        return _loop_run(launch, x, None)

    def error(self, problem: LoopProblem, result: Any, ref: Any, tf32: bool) -> tuple[float, float]:
        return _loop_error(problem, result, ref, tf32)

    def reference(self, problem: LoopProblem, inputs: LoopInputs, factory: Any) -> Any:
        """The torch emitter in float64: the tuple of the kernel's outputs."""
        from tilewright.runtime.targets import get_target
        from tilewright.templates import get_template

        aten = get_template(self.aten_template_id(problem))
        launch = factory.build(problem, Candidate.of(aten.id, aten.source_hash), get_target("cpu"))
        return launch(*inputs.tensors, *inputs.sizes, reference=True)

    def special_inputs(self, problem: LoopProblem, device: Any, seed: int = 0) -> LoopInputs | None:
        return special_loop_inputs(problem, device, seed)

    def special_reference(self, problem: LoopProblem, inputs: LoopInputs, factory: Any) -> Any:
        """The float64 reference, unless the torch form (eager's arithmetic: fp32 for narrow
        floats) disagrees with it on these inputs (an fp32 intermediate overflows where float64
        does not, say): then None, no candidate can be expected to match."""
        from tilewright.runtime.targets import get_target
        from tilewright.templates import get_template

        ref = self.reference(problem, inputs, factory)
        aten = get_template(self.aten_template_id(problem))
        eager = factory.build(problem, Candidate.of(aten.id, aten.source_hash), get_target("cpu"))(
            *inputs.tensors, *inputs.sizes)
        err, tol = self.error(problem, eager, ref, False)
        return ref if err <= tol else None

    # -- the compiler's side --------------------------------------------------------------------
    def extern_label(self, node: Any) -> str | None:
        if node.target in POINTWISE_OPS:
            return "pointwise"
        return "reduction" if node.target in REDUCTION_OPS else None

    def owns(self, node: Any) -> bool:
        from tilewright.compiler.graph import FusedNode  # the compiler imports the registry

        return isinstance(node, FusedNode)

    def capture_key(self, problem: LoopProblem) -> Any:
        # a loop problem's op is a display label: the same kernel under two labels is one kernel
        return ("loop", problem.stable_hash())

    def dims(self, problem: LoopProblem) -> tuple[str, ...]:
        return tuple(k for k, _ in problem.sizes)

    def sizes(self, problem: LoopProblem) -> dict[str, int]:
        return dict(problem.sizes)

    def invoker(self, call: Any) -> Callable[..., Any]:
        """``call(*inputs, *sizes)`` -> the output, or a tuple of outputs."""
        k = call.problem.kernel
        n_inputs = len(k.inputs)
        single = len(k.outputs) == 1
        dims = call.dims
        # a scatter's output is its target (an input nothing else reads after this kernel: the
        # scheduler makes it for the scatter alone): updated in place, no copy
        names = [b.name for b in k.inputs]
        inplace = [names.index(b.init) if b.init else None for b in k.outputs]

        scatters = any(i is not None for i in inplace)

        def invoke(*args: Any) -> Any:
            launch = call._fast
            sizes = None
            if launch is None:
                sizes = {d: int(v) for d, v in zip(dims, args[n_inputs:])}
                launch = call._launcher(sizes)
            try:
                if scatters:
                    outs = launch(*args, outs=tuple(None if i is None else args[i] for i in inplace))
                else:
                    outs = launch(*args)
            except Exception as e:  # noqa: BLE001 - costs this bucket (KernelCall.rescue)
                # a scatter may have written part of its target: the graph's call reruns
                outs = call.recover(sizes, e, args, inplace=scatters)
            return outs[0] if single else outs
        return invoke

    # -- reports and names ----------------------------------------------------------------------
    def report(self, node: Any, call: Any) -> Any:
        from tilewright.compiler.report import KernelReport, candidate_reports  # the compiler imports the registry

        sel = next(iter(call.selections.values()))
        p = node.problem
        # the candidates too: a generated kernel the tuner's check caught shows (the fuzzer
        # counts it as a find even where ATen saved the answer)
        return KernelReport(node=node.name, kind=p.kind, op=p.op, members=len(node.members),
                            winner=sel.winner.name, reason=sel.reason, bytes=p.min_bytes,
                            tune_seconds=sel.seconds, problem=p.describe(), problem_json=p.to_json(),
                            candidates=candidate_reports(sel))

    def aot_label(self, problem: LoopProblem) -> str:
        # the op label is free text, so the hash names it
        numel = f"{problem.xnumel}x{problem.rnumel}" if problem.kind == "reduction" else f"{problem.xnumel}"
        return f"{problem.kind}_{numel}_{problem.stable_hash()[:8]}"

    def warm_problems(self, problem: LoopProblem) -> list[tuple[str, Any]]:
        from tilewright.autotune.buckets import bucket_problem

        p = bucket_problem(problem, dict(problem.sizes))  # tuned at the bucket the compiled model looks up
        return [(f"{p.kind}.{p.op}", p)]


KIND = LoopKind()
