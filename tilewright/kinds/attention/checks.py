"""What the autotuner needs of the attention kind: inputs, poisoned outputs, how to run a
launcher, the float64 reference and the error measure. Launchers take their inputs in
:func:`~tilewright.kinds.attention.views.input_names` order (:mod:`.views`).

Tuning inputs are random (normal floats, never all zeros) but consistent: integer captures stay
inside their bounds, the block mask is the one ``create_block_mask`` would build from the
problem's mask_mod on these captures (:func:`tilewright.kinds.attention.reference.block_mask_tensors`),
and the backward's ``out`` and ``lse`` are the forward's on the same Q, K, V.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from tilewright.kinds.attention import reference as ref
from tilewright.kinds.attention.problem import AttentionProblem
from tilewright.kinds.attention.views import block_mask_names, input_names  # noqa: F401 - re-exported
from tilewright.ir import dtypes
from tilewright.problem import DTYPES

# ‖out − ref‖ / ‖ref‖ allowed per dtype of the kernel's inputs; lse (fp32) is judged at TOL_LSE
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 2e-2}
TOL_LSE = {"fp32": 1e-5, "fp16": 1e-3, "bf16": 1e-3}
INT_CAPTURE_VALUES = 4  # integer captures without bounds (document ids) take values 0..3, sorted


@dataclass
class AttentionInputs:
    """One run's positional inputs (in :func:`input_names` order)."""

    tensors: list[torch.Tensor]
    names: list[str]

    def get(self, name: str) -> torch.Tensor:
        return self.tensors[self.names.index(name)]

    def group(self, prefix: str) -> list[torch.Tensor]:
        return [t for n, t in zip(self.names, self.tensors) if n.startswith(prefix)]

    def block_mask(self) -> list[torch.Tensor]:
        return [t for n, t in zip(self.names, self.tensors) if n.endswith(("_num_blocks", "_indices"))]

    def captures(self) -> list[torch.Tensor]:
        return [t for n, t in zip(self.names, self.tensors) if n[:1] == "c" and n[1:].isdigit()]


def _capture(shape: Sequence[int], dtype: str, bounds, gen: torch.Generator) -> torch.Tensor:
    if dtype == "bool":
        return torch.rand(tuple(shape), generator=gen) < 0.7
    if dtypes.is_int(dtype) and bounds:
        lo, hi = bounds
        return torch.randint(lo, max(hi, lo + 1), tuple(shape), generator=gen).to(dtypes.TORCH[dtype])
    if dtypes.is_int(dtype):
        # ids of packed documents: runs of equal values (so masks have full blocks too)
        ids = torch.randint(0, INT_CAPTURE_VALUES, tuple(shape), generator=gen)
        ids = ids.sort(dim=-1).values if ids.dim() else ids
        return ids.to(dtypes.TORCH[dtype])
    return torch.randn(tuple(shape), generator=gen).to(dtypes.TORCH[dtype])


def dense_keep(problem: AttentionProblem, captures: Sequence[torch.Tensor]) -> torch.Tensor:
    """The mask_mod (and causal) over the block mask's own (batch, heads) extents:
    (Bm, Hm, Sq, Skv) booleans, True where a key is allowed."""
    bm = problem.block_mask
    Bm, Hm = (bm.batch, bm.heads) if bm else (1, 1)
    device = captures[0].device if captures else torch.device("cpu")
    rows = []
    plain = dataclasses.replace(problem, block_mask=None)  # the rule alone
    for b in range(Bm):
        env = ref._env(plain, b, 0, Hm, captures, device)
        keep = ref.allowed(plain, env, ())
        rows.append(torch.broadcast_to(keep, (1, Hm, problem.Sq, problem.Skv)))
    return torch.cat(rows)


def make_inputs(problem: AttentionProblem, device: torch.device | str, seed: int = 0) -> AttentionInputs:
    """Random, consistent inputs (see the module docstring) on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    dt = DTYPES[problem.dtype]
    q, k, v = (torch.randn(problem.shape(n), generator=gen).to(dt) for n in ("q", "k", "v"))
    caps = [_capture(c.shape, c.dtype, c.bounds, gen) for c in problem.captures]
    bm: list[torch.Tensor] = []
    if problem.block_mask is not None:
        spec = problem.block_mask
        bm = ref.block_mask_tensors(dense_keep(problem, caps), spec.q_block, spec.kv_block, full=spec.full)
    named: dict[str, torch.Tensor] = {"q": q, "k": k, "v": v}
    named.update({f"c{i}": c for i, c in enumerate(caps)})
    if problem.direction == "backward":
        fwd = dataclasses.replace(problem, direction="forward", lse_grad=False, score_grad=False, renorm=False)
        out, lse = ref.forward(fwd, q, k, v, caps, bm[:4 if problem.block_mask.full else 2] if bm else (),
                               reference=True)
        named.update(out=out.to(dt), lse=lse.float(), dout=torch.randn(problem.shape("dout"), generator=gen).to(dt))
        if problem.lse_grad:
            named["dlse"] = torch.randn(problem.shape("dlse"), generator=gen)
    names = input_names(problem)
    by_bm = dict(zip(block_mask_names(problem), bm))
    tensors = [(named[n] if n in named else by_bm[n]).to(device) for n in names]
    return AttentionInputs(tensors, names)


def order_strides(shape: Sequence[int], order: Sequence[int]) -> tuple[int, ...]:
    """The strides (elements) of a dense tensor of ``shape`` laid out in ``order`` (dims from
    outermost to innermost): what :func:`empty_output` allocates."""
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def empty_output(problem: AttentionProblem, name: str, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised output laid out as the problem records (``orders``)."""
    shape = problem.shape(name)
    order = problem.order(name)
    t = torch.empty([shape[d] for d in order], dtype=dtype, device=device)
    inverse = [order.index(d) for d in range(len(order))]
    return t.permute(inverse)


def poisoned(problem: AttentionProblem, device: torch.device | str) -> tuple[torch.Tensor, ...]:
    """The outputs full of NaN, in their recorded layouts: anything a kernel fails to write
    shows up."""
    outs = []
    for name in problem.output_names:
        dtype = torch.float32 if name in ("lse", "ds") else DTYPES[problem.dtype]
        outs.append(empty_output(problem, name, dtype, device).fill_(float("nan")))
    return tuple(outs)


def run(launch, x: AttentionInputs, outs: tuple[torch.Tensor, ...] | None) -> tuple[torch.Tensor, ...]:
    """One launch with ``outs`` as the outputs (a backward's inputs hold ``dout``); None: the
    launcher allocates them, as in a compiled graph."""
    if outs is None:
        return tuple(launch(*x.tensors))
    names = ("dq", "dk", "dv", "ds") if "dout" in x.names else ("out", "lse")
    return tuple(launch(*x.tensors, **dict(zip(names, outs))))


def reference(problem: AttentionProblem, x: AttentionInputs) -> tuple[torch.Tensor, ...]:
    """The float64 outputs for ``x``."""
    caps, bm = x.captures(), x.block_mask()
    if problem.direction == "forward":
        return ref.forward(problem, x.get("q"), x.get("k"), x.get("v"), caps, bm, reference=True)
    dlse = x.get("dlse") if problem.lse_grad else None
    return ref.backward(problem, x.get("q"), x.get("k"), x.get("v"), x.get("out"), x.get("dout"),
                        x.get("lse"), caps, bm, dlse, reference=True)


def rel_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ over the finite reference values; a non-finite reference value
    (an empty row's -inf lse) must be matched exactly, and any NaN in ``out`` is an error."""
    o, r = out.detach().cpu().double(), expected.detach().cpu().double()
    if o.shape != r.shape or torch.isnan(o).any():
        return math.inf
    finite = torch.isfinite(r)
    if not torch.equal(o[~finite], r[~finite]) or not torch.isfinite(o[finite]).all():
        return math.inf
    num, den = (o[finite] - r[finite]).norm().item(), r[finite].norm().item()
    return num / den if den > 0 else num


def error(problem: AttentionProblem, result: Sequence[torch.Tensor], expected: Sequence[torch.Tensor],
          tf32: bool) -> tuple[float, float]:
    """The worst output's error relative to its tolerance, as (error, tolerance)."""
    worst = (0.0, 1.0)
    for name, o, r in zip(problem.output_names, result, expected):
        tol = TOL_LSE[problem.dtype] if name == "lse" else TOLERANCE[problem.dtype]
        if problem.dtype == "fp32" and tf32 and name != "lse":
            tol = 2e-3
        err = rel_error(o, r)
        if err != err or err / tol > worst[0] / worst[1]:
            worst = (err, tol)
    return worst
