"""The GEMM kind, "gemm": :class:`~tilewright.kinds.gemm.problem.GemmProblem` (mm, addmm, bmm, baddbmm,
scaled_mm, the block-scaled NVFP4/MX GEMMs) with its fused epilogue.

Policy :class:`~tilewright.kinds.gemm.policy.GemmPolicy` (per target backend:
``kinds.gemm.policy.POLICIES``), cost model :func:`~tilewright.kinds.gemm.cost.estimate_gemm`,
inputs and checks :mod:`tilewright.kinds.gemm.checks`, ATen template ``aten.gemm`` (also the
float64 reference, B a slab of columns at a time). Its kernels are the kernel graph's
:class:`~tilewright.kinds.gemm.node.GemmNode`\\ s, which its lowering makes
(:mod:`tilewright.kinds.gemm.lower`, after the block-scaled rewrite :mod:`~tilewright.kinds.gemm.lower_scaled`)
and its epilogue fusion grows (:mod:`tilewright.kinds.gemm.fuse`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import torch

from tilewright.autotune.candidates import Candidate
from tilewright.kinds import ProblemKind
from tilewright.kinds.gemm import checks as gemm_inputs
from tilewright.kinds.gemm.cost import estimate_gemm
from tilewright.kinds.gemm.decode import aot_remedies
from tilewright.kinds.gemm.policy import POLICIES, GemmPolicy
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import VALUES_PER_BYTE, EpilogueInput, EpilogueOp

GEMM_DIMS = ("M", "N", "K", "batch")

REFERENCE_SLAB_BYTES = 64 << 20  # float64 B columns converted at a time


def gemm_problem(g: Any) -> GemmProblem:
    """The autotuner's view of a GEMM node (:class:`~tilewright.kinds.gemm.node.GemmNode`), at
    its trace-time sizes."""
    from tilewright.ir.epilogue import dumps
    from tilewright.problem import DTYPE_NAMES

    return GemmProblem(
        M=g.hints["M"], N=g.hints["N"], K=g.hints["K"], batch=g.hints["batch"],
        batched=g.batched, dtype=g.fmt or DTYPE_NAMES[g.dtype], out_dtype=DTYPE_NAMES[g.out_dtype],
        layout_a=g.layout_a, layout_b=g.layout_b, epilogue=tuple(g.epilogue),
        epilogue_inputs=tuple(e.pattern for e in g.epilogue_inputs), dynamic=g.dynamic, op=g.op,
        scale_layout=g.scale_layout, store_acc=bool(g.acc_value), acc_after=g.acc_after if g.acc_value else 0,
        epilogue_ir=dumps(g.epilogue_ir) if g.epilogue_ir is not None else "")


def _reference_columns(problem: GemmProblem) -> int:
    """Columns of B the float64 reference converts per step (N when all of them fit in
    :data:`REFERENCE_SLAB_BYTES`, or when the epilogue may depend on the column index: IR
    epilogues and block-scaled operands are computed whole)."""
    if problem.block_scaled or problem.epilogue_ir:
        return problem.N
    per_column = 8 * problem.K * (problem.batch if problem.batched else 1)
    return max(1, min(problem.N, REFERENCE_SLAB_BYTES // max(1, per_column)))


def _gemm_reference(factory: Any, problem: GemmProblem, x: gemm_inputs.GemmInputs) -> Any:
    from tilewright.runtime.targets import get_target
    from tilewright.templates import get_template

    aten = get_template("aten.gemm")
    launch = factory.build(problem, Candidate.of(aten.id, aten.source_hash), get_target("cpu"))
    out = torch.empty(gemm_inputs.output_shape(problem), dtype=torch.float64, device=x.a.device)
    if problem.store_acc:
        out = (out, torch.empty_like(out))
    return launch(x.a, x.b, *x.epilogue_inputs, out=out, **x.scale_kwargs)


def _resolve_view(shape: Sequence[int], numel: int) -> list[int]:
    shape = [int(s) for s in shape]
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    return shape


class GemmKind(ProblemKind):
    names = ("gemm",)
    problem_type = GemmProblem
    tune_aten_alone = True  # `tilewright warm` ships ATen's record: the bar a kernel must beat

    def rewrite_fx(self, gm: Any) -> int:
        """Block-scaled ``_scaled_mm`` / ``F.scaled_mm`` calls become tilewright's block-scaled
        GEMM ops (:mod:`tilewright.kinds.gemm.lower_scaled`), which lowering makes GEMM nodes."""
        from tilewright.kinds.gemm.lower_scaled import rewrite_all

        return rewrite_all(gm)

    def from_json(self, d: Mapping[str, Any]) -> GemmProblem:
        d = dict(d)
        d.pop("kind", None)  # GEMM JSON has none; tolerate one
        return GemmProblem.from_json(d)

    def examples(self) -> list[GemmProblem]:
        from tilewright.ir import expr as E
        from tilewright.ir.epilogue import dumps

        base = GemmProblem(M=64, N=128, K=32, dtype="bf16", layout_b="col", op="mm")
        bias = (EpilogueInput("N", "bf16"),)
        return [base] + [dataclasses.replace(base, **change) for change in (
            {"M": 48}, {"N": 96}, {"K": 64}, {"batch": 3, "batched": True}, {"batched": True},
            {"dtype": "fp16", "out_dtype": "fp16"}, {"out_dtype": "fp32"}, {"layout_a": "col"},
            {"layout_b": "row"}, {"epilogue": (EpilogueOp("relu"),)},
            {"epilogue": (EpilogueOp("add", input=0),), "epilogue_inputs": bias},
            {"dynamic": frozenset({"M"})}, {"op": "addmm"},
            {"dtype": "nvfp4", "out_dtype": "bf16", "scale_layout": "row"},
            {"store_acc": True}, {"store_acc": True, "epilogue": (EpilogueOp("relu"),), "acc_after": 1},
            {"epilogue_ir": dumps(E.op("sin", E.acc()))},
        )]

    # -- choosing ---------------------------------------------------------------------------------
    def policy(self, name: str, target: Any) -> GemmPolicy:
        factory = POLICIES.get(("gemm", target.backend))
        return factory() if factory else GemmPolicy(())

    def aot_settings(self, problem: GemmProblem, target: Any, ranked: list[tuple[float, dict]],
                     chosen: list[tuple[float, dict]]) -> list[tuple[float, dict]]:
        return aot_remedies(problem, target, ranked, chosen)

    def estimate(self, problem: GemmProblem, params: Mapping[str, Any], target: Any, template: Any) -> Any:
        return estimate_gemm(problem, params, target, efficiency=template.efficiency(target))

    # -- checking ---------------------------------------------------------------------------------
    def make_inputs(self, problem: GemmProblem, device: Any, seed: int = 0) -> gemm_inputs.GemmInputs:
        return gemm_inputs.make_inputs(problem, device, seed)

    def poisoned(self, problem: GemmProblem, device: Any) -> Any:
        return gemm_inputs.poisoned_output(problem, device)

    def run(self, launch: Callable, x: gemm_inputs.GemmInputs, out: Any) -> Any:
        return launch(x.a, x.b, *x.epilogue_inputs, out=out, **x.scale_kwargs)

    def error(self, problem: GemmProblem, result: Any, ref: Any, tf32: bool) -> tuple[float, float]:
        return gemm_inputs.rel_error(result, ref), gemm_inputs.tolerance(problem, tf32)

    def reference(self, problem: GemmProblem, inputs: gemm_inputs.GemmInputs, factory: Any) -> Any:
        step = _reference_columns(problem)
        if step >= problem.N:
            return _gemm_reference(factory, problem, inputs.as_dtype(torch.float64))
        # a wide B (an lm_head weight) in float64 would be 4x its size: go a slab of columns at
        # a time, so the reference costs one slab beside the result
        a = inputs.a.double()
        outs = []
        for n0 in range(0, problem.N, step):
            cols = slice(n0, min(problem.N, n0 + step))
            part = gemm_inputs.GemmInputs(a, inputs.b[..., cols].double(),
                                          [e[..., cols].double() for e in inputs.epilogue_inputs])
            outs.append(_gemm_reference(factory, dataclasses.replace(problem, N=cols.stop - n0), part))
        if problem.store_acc:
            return tuple(torch.cat([o[i] for o in outs], dim=-1) for i in range(2))
        return torch.cat(outs, dim=-1)

    # -- the compiler's side --------------------------------------------------------------------
    def lower(self, node: Any, index: int) -> Any:
        """A GEMM-family call as a :class:`~tilewright.kinds.gemm.node.GemmNode`
        (:func:`tilewright.kinds.gemm.lower.lower_node`)."""
        from tilewright.kinds.gemm.lower import lower_node  # the compiler imports the registry

        return lower_node(node, index)

    def fuse(self, kg: Any, gm: Any) -> int:
        """Each GEMM's epilogue chain into its kernel (:mod:`tilewright.kinds.gemm.fuse`); then
        a CPU GEMM takes a linear's weight as it is, not its transposed view
        (:mod:`tilewright.kinds.gemm.transposed`; the view is left to dead-code removal)."""
        from tilewright.compiler.fallbacks import contain
        from tilewright.compiler.pipeline import fuse_target
        from tilewright.errors import UnknownTargetError
        from tilewright.kinds.gemm.fuse import fuse_epilogues
        from tilewright.kinds.gemm.transposed import fold_weight_transposes

        policies: dict[str, bool] = {}

        def fuses(g: Any) -> bool:  # the GEMM's target's policy says whether its chain pays here
            if g.fmt or g.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                return True  # scales and quantisation belong with the low-precision GEMM
            try:
                target = fuse_target(g)
            except UnknownTargetError:  # its kernel will be ATen's: fusing changes nothing
                return True
            if target.name not in policies:
                policies[target.name] = self.policy("gemm", target).fuses_epilogues(target)
            return policies[target.name]

        fused = fuse_epilogues(kg, gm, fuses)
        try:
            fold_weight_transposes(kg)
        except Exception as e:  # noqa: BLE001 - an optimisation: the GEMMs stay as fused
            contain(e, "GEMM weights", "fuse", "passing linear weights without their view",
                    runs="the GEMMs with the view")
        return fused

    def owns(self, node: Any) -> bool:
        from tilewright.kinds.gemm.node import GemmNode  # the compiler imports the registry

        return isinstance(node, GemmNode)

    def problem_of(self, node: Any) -> GemmProblem:
        return gemm_problem(node)

    def call_options(self, node: Any) -> dict[str, Any]:
        # per epilogue input, the shape it broadcasts against: "gemm" or "view"; whether B
        # arrives as w for B = w.t() (kinds/gemm/transposed.py)
        return ({"spaces": tuple(e.space for e in node.epilogue_inputs)} | ({"b_t": True} if node.b_t else {})
                | ({"view": True} if node.view is not None else {}) | ({"scales": True} if node.scales else {}))

    def dims(self, problem: GemmProblem) -> tuple[str, ...]:
        return GEMM_DIMS

    def direct_entry(self, call: Any) -> Callable[..., Any] | None:
        # a static product with nothing after it whose kernel is ATen's (the aten.gemm template's
        # ``direct``): the wrapper calls torch.matmul / F.linear itself, no invoker frame (~45
        # GEMMs in the demo Llama's training step)
        launch, o = call._fast, call.options
        if (launch is None or call.problem.dynamic or call.problem.store_acc or o.get("spaces")
                or o.get("view") or o.get("scales") or not hasattr(launch, "direct")):
            return None
        return launch.linear if o.get("b_t") else launch.direct

    def invoker(self, call: Any) -> Callable[..., Any]:
        """``call(a, b, *epilogue_inputs, view=None, **scales) -> Tensor`` (``(out, product)``
        when the problem stores its product too); with the ``b_t`` option ``b`` is ``w`` for
        ``B = w.t()``, given to a launcher's ``linear(a, w, *epilogue_inputs)`` entry where it
        has one."""
        problem: GemmProblem = call.problem
        spaces = tuple(call.options.get("spaces", ()))
        b_t = bool(call.options.get("b_t"))
        store_acc = problem.store_acc
        # epilogue inputs all in the GEMM's own shape: a launcher that broadcasts them (ATen's,
        # oneDNN's) takes them as they come, so a static call needs no sizes (the common case:
        # a linear's bias); the other way costs ~2 us of shape arithmetic per call
        gemm_space = "view" not in spaces

        def run(launch: Callable[..., Any], a: torch.Tensor, b: torch.Tensor, *epilogue_inputs: torch.Tensor,
                **scales: torch.Tensor) -> Any:
            if b_t:  # b is w, B = w.t(): a launcher with a linear entry takes w as it is
                linear = getattr(launch, "linear", None)
                return linear(a, b, *epilogue_inputs) if linear is not None and not scales \
                    else launch(a, b.t(), *epilogue_inputs, **scales)
            return launch(a, b, *epilogue_inputs, **scales)

        def invoke(a: torch.Tensor, b: torch.Tensor, *epilogue_inputs: torch.Tensor,
                   view: Sequence[int] | None = None, **scales: torch.Tensor) -> Any:
            launch = call._fast
            if launch is not None and not store_acc and (not epilogue_inputs or (
                    gemm_space and getattr(launch, "broadcasts", False))):
                # the common static case: nothing to prepare (view's -1 is torch's own)
                try:
                    if b_t and not scales:  # run's linear entry, one frame less
                        linear = getattr(launch, "linear", None)
                        out = linear(a, b, *epilogue_inputs) if linear is not None \
                            else launch(a, b.t(), *epilogue_inputs)
                    elif not epilogue_inputs and not scales and hasattr(launch, "direct"):
                        out = launch.direct(a, b)  # ATen's GEMM itself (a plain product)
                    else:
                        out = run(launch, a, b, *epilogue_inputs, **scales)
                except Exception as e:  # noqa: BLE001 - costs this kernel (KernelCall.rescue)
                    call.rescue(None, e)
                    return invoke(a, b, *epilogue_inputs, view=view, **scales)
                if view is None:
                    return out
                # torch infers a -1 except next to a 0 (an empty product): resolved here then
                return out.view(view) if out.numel() or -1 not in view else out.view(_resolve_view(view, 0))
            if problem.block_scaled:  # stored (M, K/v) and (N, K/v), v values per byte
                M, K, N = a.shape[0], a.shape[1] * VALUES_PER_BYTE[problem.dtype], b.shape[0]
            else:
                M, K, N = a.shape[-2], a.shape[-1], b.shape[0 if b_t else -1]
            if problem.batched:
                batch = max(a.shape[0], b.shape[0])
                gemm_shape: tuple[int, ...] = (batch, M, N)
            else:
                batch, gemm_shape = 1, (M, N)
            sizes = {"M": M, "N": N, "K": K, "batch": batch}
            launch = launch or call._launcher(sizes)
            view_shape = (view if -1 not in view else _resolve_view(view, math.prod(gemm_shape))) \
                if view is not None else None
            original = epilogue_inputs
            if epilogue_inputs:
                broadcasts = getattr(launch, "broadcasts", False)  # ATen's: an expand is a call
                epilogue_inputs = tuple(
                    e.expand(view_shape).reshape(gemm_shape) if space == "view"
                    else e if broadcasts else e.expand(gemm_shape)
                    for e, space in zip(epilogue_inputs, spaces))
            try:
                out = run(launch, a, b, *epilogue_inputs, **scales)
            except Exception as e:  # noqa: BLE001 - costs this bucket (KernelCall.rescue)
                call.rescue(sizes, e)
                return invoke(a, b, *original, view=view, **scales)
            if store_acc:  # (epilogue result, the product itself)
                out, acc = out
                return (out.view(view_shape) if view_shape is not None else out), acc
            return out.view(view_shape) if view_shape is not None else out
        return invoke

    # -- reports and names ----------------------------------------------------------------------
    def report(self, node: Any, call: Any) -> Any:
        from tilewright.compiler.report import candidate_reports  # compiler imports us
        from tilewright.kinds.gemm.report import GemmReport

        sel = next(iter(call.selections.values()))
        rec = sel.winner_record
        p = call.problem
        return GemmReport(
            node=node.name, op=node.op, batch=p.batch, M=p.M, N=p.N, K=p.K, dtype=p.dtype,
            out_dtype=p.out_dtype, epilogue=p.describe_epilogue(), dynamic=sorted(p.dynamic),
            winner=sel.winner.name, winner_ms=rec.median_ms if rec else None, reason=sel.reason,
            candidates=candidate_reports(sel), tune_seconds=sel.seconds, kind=p.kind)

    def describe_short(self, problem: GemmProblem) -> str:
        return f"{problem.op} {problem.M}x{problem.N}x{problem.K} {problem.describe_epilogue()}"

    def aot_label(self, problem: GemmProblem) -> str:
        return f"{problem.op}_{problem.M}x{problem.N}x{problem.K}_{problem.dtype}_{problem.stable_hash()[:6]}"

    def warm_problems(self, problem: GemmProblem) -> list[tuple[str, Any]]:
        return [(f"{problem.M}x{problem.N}x{problem.K}", problem)]

    def bucket_variants(self, problem: GemmProblem, max_m: int | None) -> list[tuple[str, Any]]:
        from tilewright.autotune.buckets import all_buckets

        variants = all_buckets(problem, {"M": max_m} if max_m else None)
        if len(variants) == 1:
            return [("", problem)]
        return [(f"@M{p.M}", p) for p in variants]


KIND = GemmKind()
