"""The attention kind, "attention": :class:`~tilewright.kinds.attention.AttentionProblem`, SDPA and
FlexAttention forward, backward and decode.

Policy :class:`~tilewright.kinds.attention.policy.AttentionPolicy` with its cost estimate,
inputs, checks and the float64 reference in :mod:`tilewright.kinds.attention.checks`, ATen template
``aten.attention`` (SDPA's own CPU op where the problem is SDPA-shaped, the written-out math
otherwise), Triton templates ``triton.attention``, ``triton.attention_decode`` and
``triton.attention_bwd``.

In a compiled graph: hand-written attention is first rewritten into one SDPA call
(:mod:`tilewright.kinds.attention.lower_eager`, :meth:`AttentionKind.rewrite_fx`), then every
SDPA op and FlexAttention operator this kind can lower becomes a
:class:`~tilewright.compiler.graph.KernelNode` (:mod:`tilewright.kinds.attention.lower`,
:mod:`tilewright.kinds.attention.lower_flex`). The node's one output is the op's own value, the tuple
its getitems read (``(out, lse)``, ``(dq, dk, dv)``), so the graph around it is unchanged; an op
with a single tensor value (``scaled_dot_product_attention``) gets ``out``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from tilewright.autotune.cost_model import CostEstimate
from tilewright.kinds import ProblemKind
from tilewright.kinds.attention import checks, mods
from tilewright.kinds.attention.policy import AttentionPolicy, estimate
from tilewright.kinds.attention.problem import AttentionProblem, BlockMaskSpec, Capture


class AttentionKind(ProblemKind):
    names = ("attention",)
    problem_type = AttentionProblem

    def examples(self) -> list[AttentionProblem]:
        from tilewright.ir import expr as E

        base = AttentionProblem(B=2, H=4, H_kv=2, Sq=64, Skv=64, D=32, Dv=32, dtype="bf16", scale=0.125,
                                dynamic=frozenset({"Sq"}))
        softcap = mods.dumps(20.0 * E.op("tanh", mods.score() / 20.0))
        return [base] + [dataclasses.replace(base, **change) for change in (
            {"B": 4}, {"H": 8}, {"H_kv": 4}, {"Sq": 128}, {"Skv": 32}, {"D": 64}, {"Dv": 16},
            {"dtype": "fp16"}, {"scale": 0.5}, {"direction": "backward"}, {"causal": True},
            {"score_mod": softcap}, {"mask_mod": mods.dumps(mods.sliding_window(8))},
            {"mask_mod": mods.dumps(mods.boolean_mask(0, (64, 64))), "captures": (Capture((64, 64), "bool"),)},
            {"block_mask": BlockMaskSpec(32, 32)}, {"lse_base": "2"}, {"empty_lse": 0.0},
            {"direction": "backward", "lse_grad": True}, {"orders": (("out", (0, 2, 1, 3)),)},
            {"direction": "backward", "score_grad": True}, {"direction": "backward", "renorm": True},
            {"dynamic": frozenset()}, {"op": "flex_attention"},
        )]

    # -- choosing ---------------------------------------------------------------------------------
    def policy(self, name: str, target: Any) -> AttentionPolicy:
        return AttentionPolicy()

    def estimate(self, problem: AttentionProblem, params: Mapping[str, Any], target: Any,
                 template: Any) -> CostEstimate:
        return estimate(problem, dict(params), target, efficiency=template.efficiency(target))

    # -- checking ---------------------------------------------------------------------------------
    def make_inputs(self, problem: AttentionProblem, device: Any, seed: int = 0) -> checks.AttentionInputs:
        return checks.make_inputs(problem, device, seed)

    def poisoned(self, problem: AttentionProblem, device: Any) -> Any:
        return checks.poisoned(problem, device)

    def run(self, launch: Callable, x: checks.AttentionInputs, outs: Any) -> Any:
        return checks.run(launch, x, outs)

    def run_timed(self, launch: Callable, x: checks.AttentionInputs, outs: Any) -> Any:
        """Without outputs, as :meth:`invoker` calls a kernel in the graph: each candidate
        allocates its own. Timed into given outputs, ATen's op (no out= variant) was charged two
        copies the graph never makes and the generated kernels none of the allocations it does
        (demo Llama's training forward: ATen 0.079 ms tuned vs 0.037 ms called as the graph does)."""
        return checks.run(launch, x, None)

    def error(self, problem: AttentionProblem, result: Any, ref: Any, tf32: bool) -> tuple[float, float]:
        return checks.error(problem, result, ref, tf32)

    def reference(self, problem: AttentionProblem, inputs: checks.AttentionInputs, factory: Any) -> Any:
        return checks.reference(problem, inputs)

    # -- the compiler's side ------------------------------------------------------------------------
    def rewrite_dynamo(self, gm: Any) -> int:
        from tilewright.kinds.attention.sdpa_ops import rewrite_sdpa_calls

        return rewrite_sdpa_calls(gm)

    def rewrite_fx(self, gm: Any) -> int:
        from tilewright.kinds.attention.lower_eager import rewrite_eager_attention

        return rewrite_eager_attention(gm)

    def lower(self, node: Any, index: int) -> Any:
        import logging

        from tilewright.compiler.graph import KernelNode
        from tilewright.kinds.attention.lower import NotAttention, lower_node

        gm = node.graph.owning_module
        try:
            found = lower_node(node, gm)
        except NotAttention as e:
            logging.getLogger("tilewright.compiler").info("attention %s stays on ATen: %s", node.name, e)
            return None
        if found is None:
            return None
        problem, args, _ = found
        by_name = {n.name: n for n in node.graph.nodes}
        device = node.args[0].meta["val"].device
        return KernelNode(f"attention_{index}", [node], kind="attention", problem=problem,
                          args=[by_name[a] for a in args], outputs=[node.name], device=device)

    def extern_label(self, node: Any) -> str | None:
        target = str(node.target)
        return "attention" if any(w in target for w in ("scaled_dot_product", "flash_attention", "sdpa_mask_grad")) \
            else None

    def call_options(self, node: Any) -> dict[str, Any]:
        """What the op's own value is: a lone tensor (SDPA), or a tuple with slots the kernel
        does not fill (flex's max scores, its captured tensors' gradients: never read when
        lowered) after the kernel's outputs."""
        import torch

        val = node.fx_nodes[0].meta.get("val")
        if isinstance(val, torch.Tensor):
            return {"single": True, "extra": 0}
        n_out = len(node.problem.output_names)
        extra = tuple(val[n_out:]) if isinstance(val, (tuple, list)) else ()
        # the backward's last slot is itself a tuple (one gradient per captured tensor)
        filler = tuple((None,) * len(e) if isinstance(e, (tuple, list)) else None for e in extra)
        return {"single": False, "extra": filler}

    def dims(self, problem: AttentionProblem) -> tuple[str, ...]:
        return tuple(d for d in ("B", "Sq", "Skv") if d in problem.dynamic)

    def call_sizes(self, problem: AttentionProblem, args: tuple) -> dict[str, int]:
        q, k = args[0], args[1]
        sizes = {"B": q.shape[0], "Sq": q.shape[2], "Skv": k.shape[2]}
        return {d: sizes[d] for d in self.dims(problem)}

    def invoker(self, call: Any) -> Callable[..., Any]:
        problem = call.problem
        single = call.options.get("single", False)
        extra = call.options.get("extra", ())

        def invoke(*args: Any) -> Any:
            launch = call._fast or call._launcher(self.call_sizes(problem, args))
            try:
                outs = launch(*args)
            except Exception as e:  # noqa: BLE001 - costs this bucket (KernelCall.rescue)
                outs = call.recover(self.call_sizes(problem, args), e, args)
            return outs[0] if single else (*outs, *extra)
        return invoke

    # -- reports and names ----------------------------------------------------------------------
    def describe_short(self, problem: AttentionProblem) -> str:
        return (f"{problem.op} {problem.direction} {problem.B}x{problem.H}x{problem.Sq}x{problem.Skv} "
                f"D={problem.D} {problem.describe_mods()}")

    def aot_label(self, problem: AttentionProblem) -> str:
        p = problem
        kv = f"kv{p.H_kv}" if p.H_kv != p.H else ""
        return (f"{p.op}_{'bwd' if p.direction == 'backward' else 'fwd'}_{p.B}x{p.H}{kv}x{p.Sq}x{p.Skv}"
                f"_d{p.D}_{p.dtype}_{p.stable_hash()[:6]}")


KIND = AttentionKind()

__all__ = ["AttentionKind", "KIND"]
