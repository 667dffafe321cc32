"""NVFP4: 4-bit floats with an fp8 scale per 16 values and an fp32 scale per tensor.

Format (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", 2025;
element encoding from the OCP Microscaling Formats (MX) v1.0 specification):

* values are E2M1 (1 sign, 2 exponent bits with bias 1, 1 mantissa bit): ±{0, 0.5, 1, 1.5, 2, 3,
  4, 6}, no inf or NaN; two per byte, the even-indexed value in the low nibble
  (``torch.float4_e2m1fn_x2``);
* every 16 consecutive values along K share a scale stored as E4M3 (``torch.float8_e4m3fn``);
* one fp32 global scale per tensor stretches the block scales into E4M3's range.

Quantising x (ModelOpt's recipe): ``S = 448 * 6 / amax(|x|)`` is the global *encode* scale; a
block's scale is ``e4m3(amax(block) / 6 * S)``, its values ``e2m1(x * S / scale)``, rounded to
nearest even and saturated at ±6. Dequantising: ``x ≈ e2m1 * scale / S``; ``1 / S`` is the
*decode* scale this module calls ``global_scale`` and that the GEMM folds into its alpha:
``A @ B.T ≈ (qA*sA) @ (qB*sB).T * (global_scale_a * global_scale_b)``.

``swizzle_scales`` lays block scales out as Blackwell's block-scaled MMA and cuBLASLt read them
(the "128x4" layout of cuBLAS's 1D block-scaling documentation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilewright.errors import InvalidInputError

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
# magnitude of each E2M1 code 0..7 (bit 3 is the sign)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e2m1_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16 codes' values, sign bit included (code 8 is -0.0)."""
    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Round float values to the nearest E2M1 code (ties to the even code), saturating at ±6.

    Returns uint8 codes 0..15 (bit 3 = sign), one per value. NaN encodes as +0 (E2M1 has none).
    """
    x = x.float()
    sign = (torch.signbit(x)).to(torch.uint8) << 3
    a = x.abs().nan_to_num(0.0, posinf=E2M1_MAX).clamp(max=E2M1_MAX)
    # midpoints between neighbouring magnitudes; on a tie the even code (mantissa 0) wins
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=x.device)
    code = torch.bucketize(a, mids, right=False).to(torch.uint8)  # a == mid -> lower code
    tie = torch.isin(a, mids)
    lower_is_odd = (code & 1).bool()
    code = torch.where(tie & lower_is_odd, code + 1, code)
    return code | sign


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of uint8 E2M1 codes (0..15)."""
    return _e2m1_table(codes.device)[codes.long()]


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack codes (..., K) with K even into bytes (..., K/2), even index in the low nibble."""
    if codes.shape[-1] % 2:
        raise InvalidInputError(f"packing needs an even number of values along K, got {codes.shape[-1]}")
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Codes (..., 2*K2) from bytes (..., K2); accepts uint8 or float4_e2m1fn_x2 tensors."""
    b = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    return torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)


@dataclass
class NVFP4Tensor:
    """A tensor quantised to NVFP4 along its last dim.

    Attributes:
        data: uint8 (..., K/2), two E2M1 codes per byte (view as ``torch.float4_e2m1fn_x2``
            with ``as_float4()``).
        scale: float8_e4m3fn (..., K/16), one per 16 values, row-major (not swizzled).
        global_scale: float32 0-dim decode scale (``amax / (448 * 6)``).
    """

    data: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.data.shape[:-1], self.data.shape[-1] * 2)

    def as_float4(self) -> torch.Tensor:
        return self.data.view(torch.float4_e2m1fn_x2)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self, dtype)


def global_scale_for(amax: torch.Tensor | float) -> torch.Tensor:
    """Decode scale ``amax / (448 * 6)`` (float32, 0-dim); 1 for an all-zero tensor."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    return torch.where(amax > 0, amax / (E4M3_MAX * E2M1_MAX), torch.ones_like(amax))


def quantize(x: torch.Tensor, global_scale: torch.Tensor | None = None) -> NVFP4Tensor:
    """Quantise ``x`` (..., K) to NVFP4 along K.

    Args:
        x: float tensor, K a multiple of 16.
        global_scale: decode scale to use (a calibrated one); default from ``amax(|x|)``.

    Raises:
        InvalidInputError: K not a multiple of 16, or a non-float tensor.
    """
    if not x.is_floating_point():
        raise InvalidInputError(f"NVFP4 quantises float tensors, got {x.dtype}")
    K = x.shape[-1]
    if K % BLOCK:
        raise InvalidInputError(f"NVFP4 needs K (the last dim) to be a multiple of {BLOCK}, got {K}")
    xf = x.float()
    gs = global_scale_for(xf.abs().amax()) if global_scale is None else \
        torch.as_tensor(global_scale, dtype=torch.float32, device=x.device)
    encode = 1.0 / gs
    blocks = xf.reshape(*x.shape[:-1], K // BLOCK, BLOCK)
    block_amax = blocks.abs().amax(dim=-1)
    # saturate before the cast: float8_e4m3fn overflows to NaN, not to its maximum
    scale = (block_amax / E2M1_MAX * encode).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    s = scale.float().unsqueeze(-1)
    scaled = torch.where(s > 0, blocks * encode / torch.where(s > 0, s, torch.ones_like(s)),
                         torch.zeros_like(blocks))
    codes = e2m1_encode(scaled).reshape(x.shape)
    return NVFP4Tensor(pack_e2m1(codes), scale, gs.to(x.device))


def dequantize(q: NVFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Back to floats: ``e2m1 * (scale * global_scale)`` in float32, shape (..., K). The block's
    scale times the global scale is rounded first, as ModelOpt's ``NVFP4QTensor.dequantize``
    does, so a ModelOpt checkpoint dequantises to the same bits (``tests/test_modelopt.py``)."""
    vals = e2m1_decode(unpack_e2m1(q.data))
    K = vals.shape[-1]
    s = (q.scale.float() * q.global_scale.float()).repeat_interleave(BLOCK, dim=-1)[..., :K]
    return (vals * s).to(dtype)


def dequantize_packed(data: torch.Tensor, scale: torch.Tensor,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``e2m1 * block scale`` (no global scale) of packed data (rows, K/2) and row-major scales
    (rows, K/16), as ``dtype`` (rows, K). Exact in float32: E2M1 x E4M3 fits its mantissa."""
    vals = e2m1_decode(unpack_e2m1(data)).to(dtype)
    return vals * scale.to(dtype).repeat_interleave(BLOCK, dim=-1)[..., : vals.shape[-1]]


def reference_mm(a: NVFP4Tensor, b: NVFP4Tensor) -> torch.Tensor:
    """``dequant(a) @ dequant(b).T`` in float32: a (M, K), b (N, K) → (M, N)."""
    return a.dequantize() @ b.dequantize().t()


def _ceil(n: int, m: int) -> int:
    return -(-n // m) * m


def swizzle_scales(scale: torch.Tensor) -> torch.Tensor:
    """Row-major block scales (rows, K/16) → the 128x4 tiled layout, flattened.

    Rows are padded to a multiple of 128 and scale columns to a multiple of 4 (with zeros).
    Scale (r, c) lands at ``tile * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + c % 4`` where
    ``tile = (r // 128) * (padded_cols // 4) + c // 4``: each 128x4 tile is stored as 32 rows
    of 16 bytes, interleaving the four 32-row groups (cuBLAS, "1D Block Scaling Factors Layout").
    """
    rows, cols = scale.shape
    R, C = _ceil(rows, 128), _ceil(cols, 4)
    padded = torch.zeros((R, C), dtype=scale.dtype, device=scale.device)
    padded[:rows, :cols] = scale
    tiles = padded.view(R // 128, 4, 32, C // 4, 4)          # (rt, r32, r, ct, c)
    return tiles.permute(0, 3, 2, 1, 4).reshape(-1)          # (rt, ct, r, r32, c)


def swizzled_index(r: int, c: int, cols: int) -> int:
    """Where row-major scale (r, c) of a (rows, cols) scale matrix lands in ``swizzle_scales``."""
    tile = (r // 128) * (_ceil(cols, 4) // 4) + c // 4
    return tile * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + c % 4
