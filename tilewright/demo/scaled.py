"""Models written with PyTorch's own block-scaled ``F.scaled_mm`` / ``torch._scaled_mm``, as model
authors and torchao write them: ``gelu(scaled_mm(x, w.t(), ...) + bias)`` in MXFP8, MXFP4 or
NVFP4, with scales swizzled (SWIZZLE_32_4_4, what CUDA's torch takes) or plain (NO_SWIZZLE, what
ROCm's takes). For ``tilewright aot`` (a CPU host builds them for gfx950 and sm_100a) and the
tests (docs/low-precision.md)::

    tilewright aot tilewright.demo.scaled:mxfp8_example --target gfx950,sm_100a
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from tilewright.quant import dequantize_block_scaled, mx, nvfp4
from tilewright.quant.nvfp4 import swizzle_scales

RECIPES = ("mxfp8", "mxfp4", "nvfp4", "nvfp4_global")
BLOCK = {"mxfp8": 32, "mxfp4": 32, "nvfp4": 16, "nvfp4_global": 16}


def quantize(x: torch.Tensor, recipe: str, swizzled: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``x`` (rows, K) as ``F.scaled_mm`` takes it: (values, [block scales] or [block scales,
    fp32 global decode scale]); values float8_e4m3fn (mxfp8) or float4_e2m1fn_x2 (rows, K/2);
    scales in the SWIZZLE_32_4_4 layout (flat) when ``swizzled``, else (rows, K/block)."""
    if recipe.startswith("nvfp4"):
        gs = None if recipe == "nvfp4_global" else torch.ones(())
        q = nvfp4.quantize(x, gs)
        data, scale, extra = q.data.view(torch.float4_e2m1fn_x2), q.scale, [q.global_scale.reshape(())]
        if recipe == "nvfp4":
            extra = []
    else:
        q = mx.quantize(x, recipe)
        data, scale, extra = q.data, q.scale, []
        if recipe == "mxfp4":
            data = data.view(torch.float4_e2m1fn_x2)
    return data, [swizzle_scales(scale) if swizzled else scale, *extra]


def dequantize(data: torch.Tensor, scales: list[torch.Tensor], recipe: str, swizzled: bool) -> torch.Tensor:
    """float64 (rows, K) values of :func:`quantize`'s output (the reference's operand)."""
    from tilewright.quant.scales import rows_of, unswizzle

    fmt = "nvfp4" if recipe.startswith("nvfp4") else recipe
    vpb = 1 if recipe == "mxfp8" else 2
    rows, cols = data.shape[0], data.shape[-1] * vpb // BLOCK[recipe]
    s = unswizzle(scales[0], rows, cols) if swizzled else rows_of(scales[0], rows, cols)
    out = dequantize_block_scaled(fmt, data.view(torch.uint8) if vpb == 2 else data, s, torch.float64)
    return out * scales[1].double() if len(scales) == 2 else out


class ScaledMMNet(nn.Module):
    """``gelu(scaled_mm(x, w.t()) + bias)`` with a block-scaled weight (N, K) stored as its
    recipe's values and scales; ``forward(x, *x_scales)`` takes the activation quantised the
    same way. ``api`` "F" calls ``F.scaled_mm`` (recipes and swizzles named), "v1"
    ``torch._scaled_mm`` (torch infers them from the scale dtypes; not for "nvfp4_global")."""

    def __init__(self, N: int = 96, K: int = 128, recipe: str = "mxfp8", swizzled: bool = True,
                 api: str = "F", seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        w, scales = quantize(torch.randn(N, K, generator=g), recipe, swizzled)
        self.recipe, self.swizzled, self.api = recipe, swizzled, api
        self.register_buffer("w", w)
        for i, s in enumerate(scales):
            self.register_buffer(f"w_scale{i}", s)
        self.bias = nn.Parameter(torch.randn(N, generator=g).to(torch.bfloat16))

    def w_scales(self) -> list[torch.Tensor]:
        return [getattr(self, f"w_scale{i}") for i in range(2 if self.recipe == "nvfp4_global" else 1)]

    def forward(self, x: torch.Tensor, *x_scales: torch.Tensor) -> torch.Tensor:
        if self.api == "v1":
            y = torch._scaled_mm(x, self.w.t(), x_scales[0], self.w_scales()[0], out_dtype=torch.bfloat16)
        else:
            from torch.nn.functional import ScalingType, SwizzleType

            block = ScalingType.BlockWise1x32 if BLOCK[self.recipe] == 32 else ScalingType.BlockWise1x16
            recipe = [block, ScalingType.TensorWise] if self.recipe == "nvfp4_global" else block
            swz = SwizzleType.SWIZZLE_32_4_4 if self.swizzled else SwizzleType.NO_SWIZZLE
            swizzle = [swz, SwizzleType.NO_SWIZZLE] if self.recipe == "nvfp4_global" else swz
            y = F.scaled_mm(x, self.w.t(), list(x_scales) if len(x_scales) > 1 else x_scales[0], recipe,
                            self.w_scales() if len(x_scales) > 1 else self.w_scales()[0], recipe,
                            swizzle_a=swizzle, swizzle_b=swizzle, output_dtype=torch.bfloat16)
        return F.gelu(y + self.bias)

    def reference(self, x: torch.Tensor, *x_scales: torch.Tensor) -> torch.Tensor:
        """float64 ``gelu(dequant(x) @ dequant(w).T + bias)``."""
        a = dequantize(x, list(x_scales), self.recipe, self.swizzled)
        b = dequantize(self.w, self.w_scales(), self.recipe, self.swizzled)
        return F.gelu(a @ b.t() + self.bias.double())


def example(recipe: str = "mxfp8", M: int = 40, N: int = 96, K: int = 128, swizzled: bool = True,
            api: str = "F", seed: int = 1) -> tuple[nn.Module, tuple]:
    """(model, (x, *x_scales)) with a random activation quantised by ``recipe``."""
    model = ScaledMMNet(N, K, recipe, swizzled, api)
    x, scales = quantize(torch.randn(M, K, generator=torch.Generator().manual_seed(seed)) * 3, recipe, swizzled)
    return model, (x, *scales)


def mxfp8_example():
    """The MXFP8 model of issue 31, scales swizzled (SWIZZLE_32_4_4)."""
    return example("mxfp8")


def mxfp4_example():
    return example("mxfp4")


def nvfp4_example():
    """NVFP4 with fp32 global scales ([BlockWise1x16, TensorWise])."""
    return example("nvfp4_global")

