"""``cpp.gemm_onednn``: a GEMM with its bias, activation and residual in one oneDNN call on the CPU.

PyTorch ships oneDNN's inner product with post-ops as ``torch.ops.mkldnn._linear_pointwise``
(Inductor's CPU path calls it for frozen linears): ``Y = act(X @ W.T + bias)`` with the
activation applied to the accumulator in registers, or (``.binary``) ``Y = (X @ W.T + bias) OP
other`` with a tensor ``other`` the shape of ``Y``. Where the ATen candidate makes one call per
epilogue step (``addmm`` then ``gelu``: a second pass over the output, a second allocation),
this is one call. B is handed over as ``W = b.t()``, a view: a linear's weight (``b`` is
``w.t()``, K contiguous) reaches oneDNN as the weight itself; any other layout is read through
its strides (oneDNN reorders it itself).

The epilogues it runs, an op list (:class:`~tilewright.problem.EpilogueOp`), each step at
scale 1 and in the operands' dtype:

* an optional bias first (``add`` of an ``N`` input),
* then at most one of: gelu (erf or tanh), silu, sigmoid, tanh; or add / sub / mul / div
  of an ``MN`` input (a residual: ``other``, not reversed),
* and at least one fused step besides the bias (a bias alone is ``addmm``'s one call already).

Refused, with the reason: batched problems, fp16 (no oneDNN inner product on most CPUs) or
fp64 operands, bf16 where oneDNN has no bf16 path on this CPU, a different output dtype,
IR epilogues, stored products, and a torch without the op. A call oneDNN refuses at run
time raises, and the compiled graph's kernel call falls back to ATen for that kernel
(``KernelCall.rescue``): never a wrong answer.
"""

from __future__ import annotations

import functools
from typing import Any

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import SUPPORTED, RenderedKernel, Support, TemplateSpec

# epilogue kind -> (oneDNN attr, algorithm) of ``_linear_pointwise``
# (no relu: oneDNN's relu post-op computes max(x, 0), which turns a NaN product into 0 where
# torch's relu keeps NaN; a new-user trial found it, and a check on random inputs cannot)
UNARY_ATTRS: dict[str, tuple[str, str | None]] = {
    "gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"),
    "silu": ("swish", None), "sigmoid": ("sigmoid", None), "tanh": ("tanh", None),
}
BINARY_ATTRS = ("add", "sub", "mul", "div")
DTYPES = ("fp32", "bf16")


@functools.cache
def onednn_unavailable(dtype: str) -> str | None:
    """Why this torch cannot run oneDNN's fused linear on ``dtype`` operands (None: it can):
    no mkldnn build, no ``_linear_pointwise`` op (torch < 2.0), or a CPU without oneDNN's
    bf16 path."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return "this torch is built without oneDNN (mkldnn)"
    try:
        op = torch.ops.mkldnn._linear_pointwise
        op.binary  # noqa: B018 - both overloads are used
    except (AttributeError, RuntimeError):
        return "this torch has no torch.ops.mkldnn._linear_pointwise"
    if dtype == "bf16":
        try:
            ok = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            ok = False
        if not ok:
            return "oneDNN has no bf16 path on this CPU"
    return None


def onednn_plan(problem: GemmProblem) -> dict[str, Any] | str:
    """How ``problem``'s epilogue maps onto one ``_linear_pointwise`` call: ``{bias, attr,
    algorithm, other, binary}`` (``bias``/``other``: indices into ``epilogue_inputs`` or
    None; ``attr``/``algorithm`` the unary post-op, ``binary`` the binary one or None), or
    the reason it does not."""
    if problem.epilogue_ir:
        return "an IR epilogue (not an op list)"
    ops = list(problem.epilogue)
    inputs = problem.epilogue_inputs

    def tensor(op, pattern: str) -> bool:
        return (op.input is not None and op.scale == 1.0 and inputs[op.input].broadcast == pattern
                and inputs[op.input].dtype == problem.dtype)

    plan: dict[str, Any] = {"bias": None, "attr": "none", "algorithm": None, "other": None, "binary": None}
    if ops and ops[0].kind == "add" and tensor(ops[0], "N"):
        plan["bias"] = ops.pop(0).input
    if len(ops) != 1:
        return ("a bias alone is addmm's one call" if not ops
                else f"{len(ops)} steps after the bias (oneDNN fuses one post-op here)")
    op = ops[0]
    if op.kind in UNARY_ATTRS:
        plan["attr"], plan["algorithm"] = UNARY_ATTRS[op.kind]
    elif op.kind in BINARY_ATTRS and tensor(op, "MN") and not op.reverse:
        plan["other"], plan["binary"] = op.input, op.kind
    elif op.kind == "relu":
        return "relu (oneDNN's relu post-op turns NaN into 0; torch's keeps NaN)"
    else:
        return f"the step {op.describe(inputs)} (oneDNN fuses gelu/silu/sigmoid/tanh or a residual op)"
    return plan


class CppGemmOneDNN(TemplateSpec):
    """oneDNN's inner product with its post-ops, one call (see the module docstring)."""

    id = "cpp.gemm_onednn"
    backend = "cpp"
    op = "gemm"
    jinja = "gemm_onednn.py.jinja"
    compiled_on_cpu = True  # a library call: the GEMM policy offers it on the cpu target under auto
    slow_first_call = True  # oneDNN builds (JITs) its primitive per shape on the first call

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, GemmProblem):
            return Support(False, "cpp.gemm_onednn runs GEMM problems")
        if target.backend != "cpu":
            return Support(False, f"cpp.gemm_onednn is for the cpu target, not {target.name}")
        if problem.batched:
            return Support(False, "a batched GEMM (oneDNN's inner product is 2-D)")
        if problem.dtype not in DTYPES or problem.block_scaled:
            return Support(False, f"{problem.dtype} operands (oneDNN's fused linear here: fp32, bf16)")
        if problem.out_dtype != problem.dtype:
            return Support(False, f"a {problem.out_dtype} output from {problem.dtype} operands")
        if problem.store_acc:
            return Support(False, "a GEMM that also stores its product")
        plan = onednn_plan(problem)
        if isinstance(plan, str):
            return Support(False, plan)
        if (why := onednn_unavailable(problem.dtype)) is not None:
            return Support(False, why)
        return SUPPORTED

    def seed_params(self, problem: GemmProblem, target: Target) -> list[dict[str, Any]]:
        return [{}]

    def render_kernel(self, problem: GemmProblem, params: dict[str, Any], target: Target) -> RenderedKernel:
        plan = onednn_plan(problem)
        assert not isinstance(plan, str), plan  # problem_support refused it
        source = self.render_jinja(problem_text=problem.describe(), target=target.name, **plan)
        return RenderedKernel(template_id=self.id, params={}, target=target.name, source=source,
                              name="cpp_gemm_onednn", meta={"kind": "gemm", "language": "cpp"})


__all__ = ["CppGemmOneDNN", "onednn_plan", "onednn_unavailable"]
