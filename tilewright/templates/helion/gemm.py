"""A GEMM with its fused epilogue, as a Helion kernel: ``out = epilogue(a @ b)``.

The epilogue is Helion's own idiom, a callable the kernel applies to the fp32 accumulator tile
(``epilogue(acc, (tile_m, tile_n))``); :func:`make_epilogue` builds it from the problem's
:class:`~tilewright.problem.EpilogueOp` list (bias, activations, residuals, scalars: every kind
of the list, by the formulas of :mod:`tilewright.ir.epilogue`). Helion traces the closure and
passes the tensors it captures (``e0`` .. ``e3``, each an (M, N) view, stride 0 along its
broadcast dims) to the kernel. Refused, with the reason: an epilogue given as IR (any
pointwise chain), more than four epilogue inputs, and what every Helion GEMM template refuses
(:meth:`HelionTemplate.problem_support`: a stored product, batched GEMMs, strided operands,
fp8 and block-scaled operands).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.runtime.targets import Target
from tilewright.runtime.verify import InstructionCheck
from tilewright.templates.base import Knob, ParamSpace, Support, powers_of_two
from tilewright.templates.helion.base import COMMON_KNOBS, HelionTemplate
from tilewright.templates.helion.calls import HelionCall
from tilewright.templates.triton.gemm import mma_checks

hl: Any = None  # helion.language, set when a kernel is bound (base.with_helion_language)

MAX_INPUTS = 4


def gemm_epilogue(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, epilogue: Callable) -> None:
    """out (M, N) = epilogue(a (M, K) @ b (K, N)), fp32 accumulation."""
    m, k = a.size()
    _, n = b.size()
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        out[tile_m, tile_n] = epilogue(acc, (tile_m, tile_n)).to(out.dtype)


def make_epilogue(steps: tuple[str, ...], e0: torch.Tensor | None = None,
                  e1: torch.Tensor | None = None, e2: torch.Tensor | None = None,
                  e3: torch.Tensor | None = None) -> Callable:
    """The epilogue closure for ``steps`` (each ``"kind:input:scalar:scale:reverse"``, input
    ``e0``.. or empty) over the (M, N) inputs ``e0`` .. ``e3``. Helion lifts what a closure
    captures into kernel arguments: tensors must be cells of the closure (not items of a
    container), and numbers would become symbolic arguments, so they travel as text."""
    def epilogue(acc, tile):
        v = acc
        for step in steps:
            kind, name, scalar, scale, reverse = step.split(":")
            scalar, scale, reverse = float(scalar), float(scale), reverse == "1"
            if kind == "relu":
                v = torch.where(v < 0, 0.0, v)
            elif kind == "gelu":
                v = 0.5 * v * (1.0 + torch.erf(v * 0.7071067811865476))
            elif kind == "gelu_tanh":
                v = 0.5 * v * (1.0 + torch.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
            elif kind == "silu":
                v = v / (1.0 + torch.exp(-v))
            elif kind == "sigmoid":
                v = 1.0 / (1.0 + torch.exp(-v))
            elif kind == "tanh":
                v = torch.tanh(v)
            else:
                if name:
                    t = e0 if name == "e0" else e1 if name == "e1" else e2 if name == "e2" else e3
                    other = t[tile[0], tile[1]].to(torch.float32)
                    if scale != 1.0:
                        other = other * scale
                else:
                    other = scalar
                if kind == "add":
                    v = v + other
                elif kind == "sub":
                    v = other - v if reverse else v - other
                elif kind == "mul":
                    v = v * other
                else:
                    v = other / v if reverse else v / other
        return v
    return epilogue


def steps_of(problem: GemmProblem) -> tuple[str, ...]:
    """The problem's epilogue list as :func:`make_epilogue`'s steps."""
    return tuple(f"{op.kind}:{'' if op.input is None else f'e{op.input}'}:"
                 f"{float(op.scalar) if op.scalar is not None else 0.0!r}:{float(op.scale)!r}:{int(op.reverse)}"
                 for op in problem.epilogue)


GEMM_SPACE = ParamSpace((
    Knob("BLOCK_M", powers_of_two(16, 256), 64, "rows of C per program (Helion's block_sizes[0])"),
    Knob("BLOCK_N", powers_of_two(16, 256), 64, "columns of C per program (block_sizes[1])"),
    Knob("BLOCK_K", powers_of_two(16, 256), 32, "K slice per step (block_sizes[2])"),
    Knob("GROUP_M", (1, 4, 8, 16), 1, "programs per L2 swizzle group (l2_groupings[0])"),
) + COMMON_KNOBS)
# seeds the shape rules clamp to the kernel's config spec: BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
GPU_TILES = ((128, 128, 64, 8, 3), (128, 64, 64, 4, 3), (64, 128, 64, 4, 3), (64, 64, 64, 4, 3), (64, 64, 32, 4, 4))


class HelionGemm(HelionTemplate):
    """A 2-D GEMM with its epilogue list (see the module docstring)."""

    id = "helion.gemm"
    op = "gemm"
    kernel = gemm_epilogue
    space = GEMM_SPACE
    fields = {"BLOCK_M": ("block_sizes", 0), "BLOCK_N": ("block_sizes", 1), "BLOCK_K": ("block_sizes", 2),
              "GROUP_M": ("l2_groupings", 0), "num_warps": ("num_warps", None),
              "num_stages": ("num_stages", None), "indexing": ("indexing", None)}

    def helion_call(self, problem: Any, target: Target) -> HelionCall | Support:
        if not isinstance(problem, GemmProblem):
            return Support(False, "helion.gemm runs GEMMs")
        p = problem
        why = ("an epilogue given as IR (any pointwise chain): this kernel applies the epilogue list"
               if p.epilogue_ir
               else f"{len(p.epilogue_inputs)} epilogue inputs (at most {MAX_INPUTS})" if len(p.epilogue_inputs) > MAX_INPUTS
               else f"output {p.out_dtype}" if p.out_dtype not in ("fp16", "bf16", "fp32") else "")
        if why:
            return Support(False, why)
        inputs = "".join(f", e{i}" for i in range(len(p.epilogue_inputs)))
        return HelionCall(("a", "b", "out", f"_tw_epilogue({steps_of(p)!r}{inputs})"),
                          ("from tilewright.templates.helion.gemm import make_epilogue as _tw_epilogue",))

    def params_of(self, cfg: Any) -> dict[str, Any]:
        c = cfg.config
        return {"BLOCK_M": c["block_sizes"][0], "BLOCK_N": c["block_sizes"][1], "BLOCK_K": c["block_sizes"][2],
                "GROUP_M": (c.get("l2_groupings") or [1])[0], "num_warps": c["num_warps"],
                "num_stages": c["num_stages"],
                "indexing": c["indexing"] if isinstance(c["indexing"], str) else "pointer"}

    def seed_params(self, problem: GemmProblem, target: Target) -> list[dict[str, Any]] | None:
        """Helion's default config, then tiles clamped to the kernel's config spec (the
        interpreter: the largest, fewest programs), each with tensor descriptors too where the
        target has TMA or TDM."""
        spec = self.spec_or_none(problem, target)
        if spec is None:
            return []
        lo = [b.min_size for b in spec.block_sizes]
        hi = [b.max_size for b in spec.block_sizes]
        # no wider than the problem (a decode GEMM's M=1 gets 16 rows, not Helion's default 64)
        hi[0] = max(lo[0], min(hi[0], max(16, 1 << (problem.M - 1).bit_length())))
        hi[1] = max(lo[1], min(hi[1], max(16, 1 << (problem.N - 1).bit_length())))
        clamp = lambda i, v: max(lo[i], min(hi[i], v))  # noqa: E731
        default = self.params_of(spec.default_config())
        default |= {"BLOCK_M": clamp(0, default["BLOCK_M"]), "BLOCK_N": clamp(1, default["BLOCK_N"])}
        seeds = [default]
        tiles = ((64, 64, 64, 4, 1),) if target.interpreted else GPU_TILES
        for bm, bn, bk, warps, stages in tiles:
            bm, bn, bk = clamp(0, bm), clamp(1, bn), clamp(2, bk)
            if not target.interpreted:
                warps = max(1, min(warps, bm * bn // 1024))
                warps = 1 << (warps.bit_length() - 1)
            seeds.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8 if bm >= 64 else 4,
                          "num_warps": warps, "num_stages": stages})
        if target.has("tma") or target.has("tdm"):
            seeds += [s | {"indexing": "tensor_descriptor"} for s in seeds]
        return seeds

    def expected_instructions(self, problem: GemmProblem, params: Mapping[str, Any],
                              target: Target) -> list[InstructionCheck]:
        """The base checks (ISA; TMA or TDM with tensor descriptors) and the matrix
        instructions a Triton dot of this tile lowers to (wgmma, tcgen05, v_mfma, v_wmma)."""
        params = self.space.complete(params)
        return super().expected_instructions(problem, params, target) + mma_checks(problem, params, target)
