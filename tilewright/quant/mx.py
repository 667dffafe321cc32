"""MX block-scaled formats: MXFP4 (E2M1 values) and MXFP8 (E4M3 values), one shared E8M0 scale
per 32 consecutive values along K.

Format and quantisation rule: OCP Microscaling Formats (MX) Specification v1.0 (Open Compute
Project, 2023), section 5 (formats) and section 6.3 (conversion from a vector of floats):

* a block's shared scale is ``X = 2^(floor(log2(amax)) - emax_elem)``, ``amax`` the block's
  largest magnitude and ``emax_elem`` the exponent of the element format's largest normal
  (2 for E2M1, whose largest value is 6 = 1.5 * 2^2; 8 for E4M3, 448 = 1.75 * 2^8);
* the scale is stored as E8M0 (``torch.float8_e8m0fnu``): the byte ``e + 127`` means ``2^e``,
  e in -127..127, 255 is NaN;
* each value is ``x / X`` rounded to the element format (nearest, ties to even), saturated at
  the element format's largest magnitude (``amax / X`` lies in [4, 8) for E2M1, so a block's
  largest values may clip to 6: the spec's rule, kept as written).

A block of zeros gets the smallest scale (byte 0, 2^-127) and zero values. MXFP4 values are
packed two per byte, the even index in the low nibble, with the same E2M1 encoder and packing
as NVFP4 (:mod:`tilewright.quant.nvfp4`); MXFP8 values are ``float8_e4m3fn``, one per byte.
Dequantising is ``value * 2^(byte - 127)``, exact in float32 and float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilewright.errors import InvalidInputError
from tilewright.quant.nvfp4 import E2M1_MAX, E4M3_MAX, e2m1_decode, e2m1_encode, pack_e2m1, unpack_e2m1

BLOCK = 32
E8M0_BIAS = 127
# format -> (largest normal's exponent emax_elem, largest magnitude, values per stored byte)
FORMATS = {"mxfp4": (2, E2M1_MAX, 2), "mxfp8": (8, E4M3_MAX, 1)}


def _check_fmt(fmt: str) -> None:
    if fmt not in FORMATS:
        raise InvalidInputError(f"not an MX format: {fmt!r} (takes {', '.join(FORMATS)})")


def values_per_byte(fmt: str) -> int:
    """Values one stored byte holds: 2 for mxfp4, 1 for mxfp8."""
    _check_fmt(fmt)
    return FORMATS[fmt][2]


@dataclass
class MXTensor:
    """A tensor quantised to an MX format along its last dim (K).

    Attributes:
        fmt: "mxfp4" or "mxfp8".
        data: mxfp4: uint8 (..., K/2), two E2M1 codes per byte; mxfp8: float8_e4m3fn (..., K).
        scale: float8_e8m0fnu (..., K/32), row-major.
    """

    fmt: str
    data: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.data.shape[:-1], self.data.shape[-1] * values_per_byte(self.fmt))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_packed(self.data, self.scale, self.fmt, dtype)


def shared_exponents(blocks: torch.Tensor, fmt: str) -> torch.Tensor:
    """int32 ``floor(log2(amax)) - emax_elem`` per block of ``blocks`` (..., nblocks, 32),
    clamped to E8M0's -127..127; -127 for an all-zero block (OCP MX v1.0, 6.3)."""
    amax = blocks.abs().amax(dim=-1).float()
    # frexp is exact (no log2 rounding): amax = m * 2^e with m in [0.5, 1), so floor(log2) = e - 1
    _, e = torch.frexp(amax)
    zero = torch.full_like(e, -E8M0_BIAS, dtype=torch.int32)
    exp = torch.where(amax > 0, e.to(torch.int32) - 1 - FORMATS[fmt][0], zero)
    return exp.clamp(-E8M0_BIAS, E8M0_BIAS)


def quantize(x: torch.Tensor, fmt: str = "mxfp4") -> MXTensor:
    """Quantise ``x`` (..., K) to ``fmt`` along K with the OCP MX v1.0 rule (module docstring).

    Args:
        x: a float tensor, K a multiple of 32; a block with a NaN or an infinity gets the NaN
            scale (every value of it dequantises to NaN).
        fmt: "mxfp4" or "mxfp8".

    Raises:
        InvalidInputError: K not a multiple of 32 (pad K with zeros first: a zero block quantises
            exactly), a non-float tensor, or an unknown format.
    """
    _check_fmt(fmt)
    if not x.is_floating_point():
        raise InvalidInputError(f"{fmt} quantises float tensors, got {x.dtype}")
    K = x.shape[-1]
    if K % BLOCK:
        raise InvalidInputError(f"{fmt} needs K (the last dim) to be a multiple of {BLOCK}, got {K}; "
                                f"pad K with zeros to {-(-K // BLOCK) * BLOCK}")
    blocks = x.float().reshape(*x.shape[:-1], K // BLOCK, BLOCK)
    # a block holding a NaN or an infinity gets the NaN scale (byte 255): every value of it
    # then dequantises to NaN (OCP MX v1.0 section 6.3), as an NVFP4 or bf16 operand would
    # carry it; its elements are stored as zeros
    bad = ~torch.isfinite(blocks).all(-1)
    blocks = torch.where(bad.unsqueeze(-1), torch.zeros_like(blocks), blocks)
    exp = shared_exponents(blocks, fmt)
    # x / 2^exp via ldexp: exact (a power-of-two scale), also where 2^-exp overflows float32
    scaled = torch.ldexp(blocks, -exp.unsqueeze(-1).float()).reshape(x.shape)
    byte = torch.where(bad, torch.full_like(exp, 255), exp + E8M0_BIAS)
    scale = byte.to(torch.uint8).view(torch.float8_e8m0fnu)
    if fmt == "mxfp4":
        data = pack_e2m1(e2m1_encode(scaled))
    else:  # saturate first: float8_e4m3fn overflows to NaN, not to its maximum
        data = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return MXTensor(fmt, data, scale)


def scale_values(scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``2^(byte - 127)`` of E8M0 scales (float8_e8m0fnu or their uint8 bytes); 255 is NaN."""
    e = (scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale).to(torch.int32)
    one = torch.ones((), dtype=dtype, device=scale.device)
    v = torch.ldexp(one.expand(e.shape), (e - E8M0_BIAS).to(dtype))
    return torch.where(e == 255, torch.full_like(v, float("nan")), v)


def element_values(data: torch.Tensor, fmt: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Element values (..., K) of stored MX data: mxfp4 packed bytes (uint8 or
    float4_e2m1fn_x2, (..., K/2)), mxfp8 E4M3 (float8_e4m3fn or its uint8 bytes, (..., K))."""
    _check_fmt(fmt)
    if fmt == "mxfp4":
        return e2m1_decode(unpack_e2m1(data)).to(dtype)
    return (data.view(torch.float8_e4m3fn) if data.dtype != torch.float8_e4m3fn else data).to(dtype)


def dequantize_packed(data: torch.Tensor, scale: torch.Tensor, fmt: str,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``value * 2^(scale - 127)`` as ``dtype``, (rows, K), from stored data (see
    :func:`element_values`) and row-major scales (rows, K/32). Exact in float32 and float64.

    Raises:
        InvalidInputError: an unknown format, or scales that are not (rows, K/32).
    """
    vals = element_values(data, fmt, dtype)
    if scale.shape != (*vals.shape[:-1], vals.shape[-1] // BLOCK):
        raise InvalidInputError(f"{fmt} scales {tuple(scale.shape)} do not match values "
                                f"{tuple(vals.shape)}: expected one per {BLOCK} along K")
    return vals * scale_values(scale, dtype).repeat_interleave(BLOCK, dim=-1)


def dequantize(q: MXTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Back to floats, shape (..., K)."""
    return q.dequantize(dtype)


def random_operand(fmt: str, rows: int, K: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random stored (data, scale) of a (rows, K) operand for tests and the autotuner: every
    E2M1 code (mxfp4) or E4M3 from a normal draw (mxfp8, never NaN); scales 2^-4 ... 2^4 as
    float8_e8m0fnu. On the CPU."""
    _check_fmt(fmt)
    if fmt == "mxfp4":
        data = torch.randint(0, 256, (rows, K // 2), generator=gen, dtype=torch.uint8)
    else:
        data = (torch.randn(rows, K, generator=gen) * 2).to(torch.float8_e4m3fn)
    exps = torch.randint(E8M0_BIAS - 4, E8M0_BIAS + 5, (rows, K // BLOCK), generator=gen)
    return data, exps.to(torch.uint8).view(torch.float8_e8m0fnu)
