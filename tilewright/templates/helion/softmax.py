"""Softmax over the last dim, as a Helion kernel: ``exp(x - max(x)) / sum(exp(x - max(x)))`` in
fp32, rounded once to the output dtype (what ``torch.softmax`` decomposes to, and what the
loop-kernel IR holds for it). :func:`match_softmax` recognises exactly that and refuses the
rest (a scale fused in, a log-softmax, a mask)."""

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


def softmax_rows(x: torch.Tensor, out: torch.Tensor) -> None:
    """x, out (rows, N), fp16/bf16/fp32; fp32 math."""
    m, n = x.size()
    for tile_m in hl.tile(m):
        v = x[tile_m, :].to(torch.float32)
        e = torch.exp(v - torch.amax(v, dim=1, keepdim=True))
        out[tile_m, :] = (e / torch.sum(e, dim=1, keepdim=True)).to(out.dtype)


def match_softmax(problem: LoopProblem) -> dict[str, str] | Support:
    """The input and output buffer of a softmax over the last dim, or why ``problem`` is not one."""
    index = row_index(problem)
    if isinstance(index, Support):
        return index
    k = problem.kernel
    if len(k.inputs) != 1 or len(k.outputs) != 1 or len(k.stores) != 1:
        return Support(False, "not a softmax: it reads one tensor and stores one")
    (store,) = k.stores
    if store.mask is not None or store.index != index:
        return Support(False, "not a softmax: its store is masked or not at the row's element")
    x = M.up(M.load("x", index))
    e = M.op("exp", M.op("sub", x, M.Pat("reduce", (x,), arg="max")), capture="e")
    pattern = M.rounded(M.op("truediv", e, M.Pat("reduce", (e,), arg="sum")), k.outputs[0].dtype)
    env = M.match(pattern, store.value, {})
    if env is None:
        return Support(False, "not the softmax this kernel computes (exp(x - max x) / sum, in fp32)")
    return {"x": env["x"].arg[0], "out": store.buffer}


class HelionSoftmax(RowTemplate):
    """Softmax rows (see the module docstring)."""

    id = "helion.softmax"
    kernel = softmax_rows

    def helion_call(self, problem: Any, target: Target) -> HelionCall | Support:
        if not isinstance(problem, LoopProblem):
            return Support(False, "helion.softmax runs loop kernels")
        found = match_softmax(problem)
        if isinstance(found, Support):
            return found
        return self.viewable(problem, HelionCall((self.rows(problem, found["x"]), self.rows(problem, found["out"]))))
