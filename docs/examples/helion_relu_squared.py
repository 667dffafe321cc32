"""A GEMM-epilogue Helion template written outside tilewright (docs/kernel-authors.md,
"Matching a GEMM's epilogue"): ``relu(x @ w) ** 2``, the squared-ReLU MLP activation.

Its epilogue is not one of the op list's kinds (bias, activations, residuals), so the problem
carries it as expression IR (``problem.epilogue_ir``: relu is ``where(lt(acc, 0), 0, acc)``,
the square a ``mul``, eager's fp16 rounding between them a cast) and ``problem.epilogue`` is
empty. ``supports`` does not read either form: ``computes_epilogue`` compares the problem's
epilogue with a torch function of the accumulator, in float64.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.templates import Support, computes_epilogue
from tilewright.templates.helion import HelionCall, helion_template


@helion.kernel(static_shapes=True)
def relu_squared(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
    """out (M, N) = relu(x (M, K) @ w (K, N)) ** 2, fp32 accumulation, rounded once."""
    m, k = x.size()
    _, n = w.size()
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, x[tile_m, tile_k], w[tile_k, tile_n])
        r = torch.relu(acc)
        out[tile_m, tile_n] = (r * r).to(out.dtype)  # written in place: tilewright passes `out` in


def epilogue(acc: torch.Tensor) -> torch.Tensor:
    """What the kernel does after the product, in torch: the pattern supports() matches."""
    return torch.relu(acc) ** 2


def supports(problem, target) -> Support | HelionCall:
    """Only the GEMMs whose fused epilogue is relu(acc) ** 2, and how to call the kernel."""
    if not isinstance(problem, GemmProblem):
        return Support(False, "relu_squared runs GEMMs")
    if problem.batched or problem.dtype not in ("fp16", "bf16") or problem.out_dtype != problem.dtype:
        return Support(False, "2-D fp16/bf16 GEMMs only")
    if not (same := computes_epilogue(problem, epilogue)):
        return same  # Support(False, "its epilogue is ...: at acc=... it gives ..."): shown in reports
    return HelionCall(("a", "b", "out"))


def register():
    """Register the template (again is a no-op) and return it."""
    from tilewright.templates import get_template

    try:
        return get_template("helion.relu_squared")
    except KeyError:
        return helion_template(relu_squared, op="gemm", supports=supports)
