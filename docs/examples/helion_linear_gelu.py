"""A Helion kernel written outside tilewright, registered as a template (docs/kernel-authors.md,
"Adding a Helion template"): ``gelu(x @ w + bias)``, an ``nn.Linear`` followed by GELU.

The kernel is plain Helion. ``supports`` accepts exactly the GEMMs it computes (the problem's
fused epilogue must be "add the bias, then GELU") and says how to call it: the expressions
name the GEMM launcher's tensors (``a``, ``b``, ``out`` and the epilogue inputs ``e0``, ...,
each broadcast to (M, N): ``e0[0]`` is the bias as one row). tilewright binds the kernel, asks
Helion for Triton at the configs its tuner proposes, measures them, caches the choice and
builds them ahead of time; Helion's own autotuner never runs.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import EpilogueOp
from tilewright.templates import Support
from tilewright.templates.helion import HelionCall, helion_template


@helion.kernel(static_shapes=True)
def linear_gelu(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, out: torch.Tensor) -> None:
    """out (M, N) = gelu(x (M, K) @ w (K, N) + bias (N,)), fp32 accumulation, erf GELU."""
    m, k = x.size()
    _, n = w.size()
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, x[tile_m, tile_k], w[tile_k, tile_n])
        v = acc + bias[tile_n].to(torch.float32)
        out[tile_m, tile_n] = (0.5 * v * (1.0 + torch.erf(v * 0.7071067811865476))).to(out.dtype)


BIAS_THEN_GELU = (EpilogueOp("add", input=0), EpilogueOp("gelu"))


def supports(problem, target) -> Support | HelionCall:
    """Only the GEMMs this kernel computes exactly, and how to call it for one."""
    if not isinstance(problem, GemmProblem):
        return Support(False, "linear_gelu runs GEMMs")
    if problem.epilogue != BIAS_THEN_GELU or problem.epilogue_inputs[0].broadcast != "N":
        return Support(False, f"computes gelu(x @ w + bias), not epilogue {problem.describe_epilogue()}")
    if problem.batched or problem.dtype not in ("fp16", "bf16") or problem.out_dtype != problem.dtype:
        return Support(False, "2-D fp16/bf16 GEMMs only")
    return HelionCall(("a", "b", "e0[0]", "out"))


def register():
    """Register the template (again is a no-op) and return it."""
    from tilewright.templates import get_template

    try:
        return get_template("helion.linear_gelu")
    except KeyError:
        return helion_template(linear_gelu, op="gemm", supports=supports)

