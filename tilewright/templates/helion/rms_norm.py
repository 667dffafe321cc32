"""RMSNorm after a residual add, as a Helion kernel: ``h = x + residual`` (stored: the residual
stream goes on), ``out = h * rsqrt(mean(h^2) + eps) * weight``.

Two forms occur in models, and the kernel computes each exactly (a constexpr picks it):
``nn.RMSNorm``/``F.rms_norm`` multiply the fp32 normalised value by the weight, Hugging Face's
Llama-family ``RMSNorm`` rounds it to the input dtype first (``weight * h.to(input_dtype)``).
:func:`match_rms_norm` recognises either in a loop kernel's IR, node for node, and refuses
anything else (another op fused in, a missing store, other roundings).
"""

from __future__ import annotations

from typing import Any

import torch

from tilewright.problem import LoopProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import Support
from tilewright.templates.helion import match as M
from tilewright.templates.helion.calls import HelionCall
from tilewright.templates.helion.rows import RowTemplate, row_index

hl: Any = None  # helion.language, set when a kernel is bound (base.with_helion_language)


def rms_norm_residual(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
                      new_residual: torch.Tensor, eps: float, round_before_weight: hl.constexpr) -> None:
    """x, residual, out, new_residual (rows, N); weight (N,); fp16/bf16/fp32; fp32 math."""
    m, n = x.size()
    for tile_m in hl.tile(m):
        h = (x[tile_m, :].to(torch.float32) + residual[tile_m, :].to(torch.float32)).to(new_residual.dtype)
        new_residual[tile_m, :] = h
        hf = h.to(torch.float32)
        inv = torch.rsqrt(torch.mean(hf * hf, dim=-1) + eps)
        y = hf * inv[:, None]
        w = weight[None, :].to(torch.float32)
        if round_before_weight:
            out[tile_m, :] = (w * y.to(x.dtype).to(torch.float32)).to(out.dtype)
        else:
            out[tile_m, :] = (y * w).to(out.dtype)


def _pattern(index, reduced, dt_x: str, dt_res: str, dt_out: str, llama: bool) -> tuple[M.Pat, M.Pat]:
    """(new residual, output) patterns for one form and its dtypes."""
    h32 = M.op("add", M.up(M.load("x", index)), M.up(M.load("residual", index)), capture="h32")
    h = M.rounded(h32, dt_res)
    hf = M.up(h)
    square = M.Pat(None, either=(M.op("mul", hf, hf), M.op("pow", hf, M.const(lambda v: v == 2.0))))
    mean = M.op("truediv", M.Pat("reduce", (square,), arg="sum"), M.row_size(reduced))
    inv = M.op("rsqrt", M.op("add", mean, M.const(capture="eps")))
    y = M.op("mul", hf, inv)
    w = M.up(M.load("weight", index[-1:]))
    if llama:
        out = M.rounded(M.op("mul", w, M.up(M.rounded(y, dt_x))), dt_out)
    else:
        out = M.rounded(M.op("mul", y, w), dt_out)
    return h, out


def match_rms_norm(problem: LoopProblem) -> dict[str, Any] | Support:
    """The buffers (``x``, ``residual``, ``weight``, ``out``, ``new_residual``), ``eps`` and the
    form (``round_before_weight``) of a residual RMSNorm, or why ``problem`` is not one."""
    index = row_index(problem)
    if isinstance(index, Support):
        return index
    k = problem.kernel
    if len(k.inputs) != 3 or len(k.outputs) != 2 or len(k.stores) != 2:
        return Support(False, "not a residual RMSNorm: it takes x, residual and weight and stores h and the norm")
    stores = {s.buffer: s for s in k.stores}
    if any(s.mask is not None or s.index != index for s in k.stores):
        return Support(False, "not a residual RMSNorm: a store is masked or not at the row's element")
    dt = {b.name: b.dtype for b in k.inputs + k.outputs}
    for res_name, out_name in (("out0", "out1"), ("out1", "out0")):
        for llama in (False, True):
            x_dtypes = {dt[b.name] for b in k.inputs if len(b.shape) > 1}
            for dt_x in sorted(x_dtypes):
                p_res, p_out = _pattern(index, k.rnumel, dt_x, dt[res_name], dt[out_name], llama)
                env = M.match(p_res, stores[res_name].value, {})
                env = env if env is None else M.match(p_out, stores[out_name].value, env)
                if env is None:
                    continue
                names = {role: env[role].arg[0] for role in ("x", "residual", "weight")}
                if dt[names["x"]] != dt_x or len(set(names.values())) != 3:
                    continue
                return {**names, "out": out_name, "new_residual": res_name, "eps": env["eps"].arg,
                        "round_before_weight": llama}
    return Support(False, "not the residual RMSNorm this kernel computes (h = x + residual stored, "
                          "h * rsqrt(mean(h*h) + eps) * weight, with its roundings)")


class HelionRmsNorm(RowTemplate):
    """Residual RMSNorm rows (see the module docstring)."""

    id = "helion.rms_norm"
    kernel = rms_norm_residual

    def helion_call(self, problem: Any, target: Target) -> HelionCall | Support:
        if not isinstance(problem, LoopProblem):
            return Support(False, "helion.rms_norm runs loop kernels")
        found = match_rms_norm(problem)
        if isinstance(found, Support):
            return found
        args = tuple(self.rows(problem, found[role]) if role != "weight" else found[role]
                     for role in ("x", "residual", "weight", "out", "new_residual"))
        call = HelionCall(args + (repr(found["eps"]), repr(found["round_before_weight"])))
        return self.viewable(problem, call)
