"""``NVFP4Linear`` and ``MXFP4Linear``/``MXFP8Linear``: Linears whose weight is stored in a
block-scaled format and whose activations are quantised to it on the fly (W4A4 / W8A8), as
ModelOpt's NVFP4 linear layers do; MX follows OCP MX v1.0 (:mod:`tilewright.quant.mx`).

For inference: the weight, its scales and the bias are buffers, not parameters, and the ops have
no backward (quantisation-aware training is out of scope). A layer whose input requires grad
while grad mode is on (a model with trainable layers before it, called outside ``torch.no_grad()``)
raises :class:`~tilewright.errors.InvalidInputError` at once, in eager and compiled models alike,
instead of a backward that cannot run; with grad mode on but no gradient needed it just runs.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from tilewright.errors import InvalidInputError
from tilewright.quant import mx, nvfp4


def register_ops() -> None:
    """Register ``torch.ops.tilewright.nvfp4_*`` and ``mx_*``, which the layers call: they are
    public ops (:mod:`tilewright.kernels`, a layer above the formats of this package, which it
    imports), so a layer imports them when it is made, not this module at its import."""
    import tilewright.kernels.mx  # noqa: F401
    import tilewright.kernels.nvfp4  # noqa: F401


INFERENCE_ONLY = ("NVFP4Linear and MX linear layers are inference-only (their input requires grad, and they have no "
                  "backward); call the model under torch.no_grad() or torch.inference_mode()")


class NVFP4Linear(nn.Module):
    """y = x @ W.T + b with W and x in NVFP4 (fp32 accumulation, alpha folded into the GEMM).

    Buffers (inference only: nothing here trains): ``weight`` uint8 (out, in/2),
    ``weight_scale`` float8_e4m3fn (out, in/16), ``weight_global_scale`` fp32 (), optional
    ``input_global_scale`` fp32 () (calibrated; when absent each call quantises the activation
    with its own amax), ``bias`` (the Linear's dtype) or None.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: torch.dtype = torch.float32, device=None):
        super().__init__()
        register_ops()
        if in_features % nvfp4.BLOCK:
            raise InvalidInputError(f"NVFP4Linear needs in_features divisible by {nvfp4.BLOCK}, got {in_features}")
        self.in_features, self.out_features, self.dtype = in_features, out_features, dtype
        self.register_buffer("weight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
        self.register_buffer("weight_scale", torch.zeros(out_features, in_features // nvfp4.BLOCK,
                                                         dtype=torch.float8_e4m3fn, device=device))
        self.register_buffer("weight_global_scale", torch.ones((), device=device))
        self.register_buffer("input_global_scale", None)
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "NVFP4Linear":
        """Quantise a float Linear's weight (the bias stays in the Linear's dtype)."""
        w = linear.weight.detach()
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, w.dtype, w.device)
        q = nvfp4.quantize(w)
        m.weight.copy_(q.data)
        m.weight_scale.copy_(q.scale)
        m.weight_global_scale.copy_(q.global_scale)
        if linear.bias is not None:
            m.bias.copy_(linear.bias.detach())
        return m

    @torch.no_grad()
    def calibrate(self, x: torch.Tensor) -> None:
        """Fix the activation's global scale from a sample (else it is recomputed every call)."""
        self.input_global_scale = nvfp4.global_scale_for(x.detach().abs().amax().float()).to(x.device)

    def dequantized_weight(self) -> torch.Tensor:
        """The weight the layer multiplies by: (out_features, in_features) in the layer's dtype,
        each e2m1 value times its block's e4m3 scale (one per 16 values along ``in``) times the
        fp32 global scale. For checking the quantisation error against the float weight, or for
        running the layer in plain torch (``x @ w.T + bias``, activations unquantised); it is a
        new tensor each call, nothing is cached. The layer's own forward also quantises ``x``."""
        return nvfp4.dequantize(nvfp4.NVFP4Tensor(self.weight, self.weight_scale, self.weight_global_scale),
                                self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            raise InvalidInputError(INFERENCE_ONLY)
        lead = x.shape[:-1]
        xq, xs, xg = torch.ops.tilewright.nvfp4_quantize(x.reshape(-1, self.in_features),
                                                         self.input_global_scale)
        if self.input_global_scale is not None:
            # the op returns a copy of a calibrated scale: reading the buffer itself leaves the
            # op's outputs to the packed values and block scales, which a compiled model's
            # producer kernel writes itself (kinds/loop/lower/quantize.py)
            xg = self.input_global_scale
        y = torch.ops.tilewright.nvfp4_mm(xq, xs, xg, self.weight, self.weight_scale,
                                          self.weight_global_scale, self.bias, x.dtype)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class MXLinear(nn.Module):
    """y = x @ W.T + b with W and x in an MX format (OCP MX v1.0; fp32 accumulation): the forward
    is ``tilewright.mx_quantize`` on the activation and one ``tilewright.mx_mm``.

    Buffers (inference only): ``weight`` (out, in/2) uint8 for mxfp4 or (out, in)
    float8_e4m3fn for mxfp8, ``weight_scale`` float8_e8m0fnu (out, in/32), ``bias`` (the
    Linear's dtype) or None. MX needs no per-tensor scale: each activation block gets its own
    power-of-two scale every call.

    Raises:
        InvalidInputError: in_features not a multiple of 32 (pad the layer's input with zeros),
            or an unknown format.
    """

    fmt = "mxfp4"

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: torch.dtype = torch.float32, device=None, fmt: str | None = None):
        super().__init__()
        register_ops()
        self.fmt = fmt or type(self).fmt
        vpb = mx.values_per_byte(self.fmt)
        if in_features % mx.BLOCK:
            raise InvalidInputError(f"{type(self).__name__} ({self.fmt}) needs in_features divisible by "
                                    f"{mx.BLOCK}, got {in_features}")
        self.in_features, self.out_features, self.dtype = in_features, out_features, dtype
        self.register_buffer("weight", torch.zeros(out_features, in_features // vpb, device=device,
                                                   dtype=torch.uint8 if vpb == 2 else torch.float8_e4m3fn))
        self.register_buffer("weight_scale", torch.zeros(out_features, in_features // mx.BLOCK, device=device,
                                                         dtype=torch.uint8).view(torch.float8_e8m0fnu))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str | None = None) -> "MXLinear":
        """Quantise a float Linear's weight (the bias stays in the Linear's dtype)."""
        w = linear.weight.detach()
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, w.dtype, w.device, fmt)
        q = mx.quantize(w, m.fmt)
        m.weight.copy_(q.data)
        m.weight_scale.copy_(q.scale)
        if linear.bias is not None:
            m.bias.copy_(linear.bias.detach())
        return m

    def dequantized_weight(self) -> torch.Tensor:
        """The weight the layer multiplies by, (out, in) in the layer's dtype."""
        return mx.dequantize_packed(self.weight, self.weight_scale, self.fmt, torch.float32).to(self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            raise InvalidInputError(INFERENCE_ONLY)
        lead = x.shape[:-1]
        xq, xs = torch.ops.tilewright.mx_quantize(x.reshape(-1, self.in_features), self.fmt)
        y = torch.ops.tilewright.mx_mm(xq, xs, self.weight, self.weight_scale, None, self.bias,
                                       self.fmt, x.dtype)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, fmt={self.fmt}")


class MXFP4Linear(MXLinear):
    """:class:`MXLinear` in MXFP4 (E2M1 values, E8M0 scale per 32)."""

    fmt = "mxfp4"


class MXFP8Linear(MXLinear):
    """:class:`MXLinear` in MXFP8 (E4M3 values, E8M0 scale per 32)."""

    fmt = "mxfp8"


LINEAR_FORMATS = {"nvfp4": (NVFP4Linear, nvfp4.BLOCK), "mxfp4": (MXFP4Linear, mx.BLOCK),
                  "mxfp8": (MXFP8Linear, mx.BLOCK)}


def quantize_linears(model: nn.Module, *, skip: tuple[str, ...] = (), fmt: str = "nvfp4") -> int:
    """Replace every ``nn.Linear`` whose in_features is a multiple of the format's block (16 for
    nvfp4, 32 for mxfp4/mxfp8) and whose name has none of the ``skip`` substrings by the
    format's quantised linear (:class:`NVFP4Linear`, :class:`MXFP4Linear`,
    :class:`MXFP8Linear`), in place. Returns how many.

    Raises:
        InvalidInputError: an unknown ``fmt``.
    """
    if fmt not in LINEAR_FORMATS:
        raise InvalidInputError(f"quantize_linears: unknown format {fmt!r} (takes {', '.join(LINEAR_FORMATS)})")
    cls, block = LINEAR_FORMATS[fmt]
    count = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and child.in_features % block == 0 \
                    and not any(s in full for s in skip):
                setattr(module, child_name, cls.from_linear(child))
                count += 1
    return count
