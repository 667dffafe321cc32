"""An MoE expert projection written with PyTorch's own ``F.scaled_grouped_mm`` (MXFP8, MXFP4,
NVFP4 with per-group global scales), as torch's tests and torchao lay out its operands:
tokens (M_total, K) sorted by expert, ``offs`` the groups' int32 end offsets, experts' weights
(G, N, K) passed as ``w.transpose(-2, -1)``; each token group's scales swizzled on their own
(SWIZZLE_32_4_4, padded to 128 rows) and concatenated, each expert's weight scales one swizzled
block; or plain (NO_SWIZZLE). For the tests and ``tilewright aot`` (docs/low-precision.md)::

    tilewright aot tilewright.demo.scaled_grouped:mxfp8_moe_example --target sm_90a,sm_100a
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from tilewright.demo.scaled import BLOCK, dequantize, quantize
from tilewright.quant.nvfp4 import swizzle_scales

GROUPED_RECIPES = ("mxfp8", "mxfp4", "nvfp4_global")


def quantize_groups(x: torch.Tensor, offs: list[int], recipe: str, swizzled: bool
                    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``x`` (M_total, K) in row groups ending at ``offs``, as ``F.scaled_grouped_mm`` takes it:
    (values, [scales] or [scales, fp32 per-group global scales (G,)]), each group quantised and
    its scales swizzled on their own (empty groups add nothing)."""
    data, scales, globals_ = [], [], []
    for s, e in zip([0] + offs[:-1], offs):
        if e <= s:
            globals_.append(torch.ones(()))
            continue
        d, sc = quantize(x[s:e], recipe, swizzled=False)
        data.append(d.view(torch.uint8))
        scales.append(swizzle_scales(sc[0]) if swizzled else sc[0])
        globals_.append(sc[1].reshape(()) if len(sc) == 2 else torch.ones(()))
    d = torch.cat(data).view(d.dtype)
    extra = [torch.stack(globals_)] if recipe == "nvfp4_global" else []
    return d, [torch.cat(scales) if swizzled else torch.cat(scales), *extra]


def dequantize_groups(data: torch.Tensor, scales: list[torch.Tensor], offs: list[int], recipe: str,
                      swizzled: bool) -> torch.Tensor:
    """float64 (M_total, K) values of :func:`quantize_groups`' output (the reference's operand)."""
    from tilewright.quant.scales import swizzled_numel

    cols = data.shape[1] * (1 if recipe == "mxfp8" else 2) // BLOCK[recipe]
    out, at = [], 0
    for g, (s, e) in enumerate(zip([0] + offs[:-1], offs)):
        if e <= s:
            continue
        n = swizzled_numel(e - s, cols) if swizzled else (e - s) * cols
        sc = [scales[0].reshape(-1)[at:at + n]] + ([scales[1][g]] if len(scales) == 2 else [])
        at += n
        out.append(dequantize(data[s:e], sc, recipe, swizzled))
    return torch.cat(out)


class ScaledMoE(nn.Module):
    """``silu(F.scaled_grouped_mm(x, w.transpose(-2, -1), ..., offs=offs))`` (with ``glu``: the
    gate_up projection's ``silu(gate) * up`` of its two halves): G experts' (N, K) weights stored
    in ``recipe``; ``forward(x, offs, *x_scales)``."""

    def __init__(self, G: int = 4, N: int = 64, K: int = 128, recipe: str = "mxfp8", swizzled: bool = True,
                 seed: int = 0, glu: bool = False):
        super().__init__()
        self.glu = glu  # the gate_up projection: silu(gate) * up of the two halves instead
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(G, N, K, generator=g)
        parts = [quantize(w[i], recipe, swizzled) for i in range(G)]
        self.recipe, self.swizzled, self.G = recipe, swizzled, G
        self.register_buffer("w", torch.stack([p[0].view(torch.uint8) for p in parts]).view(parts[0][0].dtype))
        self.register_buffer("w_scale", torch.stack([p[1][0] for p in parts]).reshape(G, -1))
        if recipe == "nvfp4_global":
            self.register_buffer("w_global", torch.stack([p[1][1].reshape(()) for p in parts]))

    def w_scales(self) -> list[torch.Tensor]:
        return [self.w_scale] + ([self.w_global] if self.recipe == "nvfp4_global" else [])

    def forward(self, x: torch.Tensor, offs: torch.Tensor, *x_scales: torch.Tensor) -> torch.Tensor:
        from torch.nn.functional import ScalingType, SwizzleType

        block = ScalingType.BlockWise1x32 if BLOCK[self.recipe] == 32 else ScalingType.BlockWise1x16
        swz = SwizzleType.SWIZZLE_32_4_4 if self.swizzled else SwizzleType.NO_SWIZZLE
        if self.recipe == "nvfp4_global":
            recipe, swizzle, sa, sb = [block, ScalingType.TensorWise], [swz, SwizzleType.NO_SWIZZLE], \
                list(x_scales), self.w_scales()
        else:
            recipe, swizzle, sa, sb = block, swz, x_scales[0], self.w_scale
        y = F.scaled_grouped_mm(x, self.w.transpose(-2, -1), sa, recipe, sb, recipe, swizzle_a=swizzle,
                                swizzle_b=swizzle, offs=offs, output_dtype=torch.bfloat16)
        if self.glu:
            gate, up = y.chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.silu(y)

    def reference(self, x: torch.Tensor, offs: torch.Tensor, *x_scales: torch.Tensor) -> torch.Tensor:
        """float64 ``silu(dequant(x[group g]) @ dequant(w[g]).T)``; NaN in rows past ``offs[-1]``."""
        ends = [int(v) for v in offs.tolist()]
        a = dequantize_groups(x, list(x_scales), ends, self.recipe, self.swizzled)
        out = torch.full((x.shape[0], self.w.shape[1]), float("nan"), dtype=torch.float64)
        for g, (s, e) in enumerate(zip([0] + ends[:-1], ends)):
            if e > s:
                sb = [self.w_scale[g]] + ([self.w_global[g]] if self.recipe == "nvfp4_global" else [])
                out[s:e] = a[s:e] @ dequantize(self.w[g], sb, self.recipe, self.swizzled).t()
        if self.glu:
            gate, up = out.chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.silu(out)


def moe_example(recipe: str = "mxfp8", sizes: tuple[int, ...] = (20, 0, 37, 7), N: int = 64, K: int = 128,
                swizzled: bool = True, seed: int = 1, glu: bool = False) -> tuple[nn.Module, tuple]:
    """(model, (x, offs, *x_scales)): ragged token groups of ``sizes`` (an empty one by default)."""
    ends = torch.tensor(sizes).cumsum(0).tolist()
    model = ScaledMoE(len(sizes), N, K, recipe, swizzled, glu=glu)
    x = torch.randn(ends[-1], K, generator=torch.Generator().manual_seed(seed)) * 3
    data, scales = quantize_groups(x, ends, recipe, swizzled)
    return model, (data, torch.tensor(ends, dtype=torch.int32), *scales)


def mxfp8_moe_example():
    """An MXFP8 MoE projection, swizzled scales, 4 experts with ragged tokens (one expert empty)."""
    return moe_example("mxfp8")
