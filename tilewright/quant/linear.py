"""``NVFP4Linear``: a Linear whose weight is stored in NVFP4 and whose activations are
quantised to NVFP4 on the fly (W4A4), as ModelOpt's NVFP4 linear layers do.

For inference: the weight, its scales and the bias are buffers, not parameters, and the ops have
no backward (quantisation-aware training is out of scope). A layer whose input requires grad
while grad mode is on (a model with trainable layers before it, called outside ``torch.no_grad()``)
raises :class:`~tilewright.errors.InvalidInputError` at once, in eager and compiled models alike,
instead of a backward that cannot run; with grad mode on but no gradient needed it just runs.
"""

from __future__ import annotations

import torch
import torch.nn as nn

import tilewright.kernels.nvfp4  # noqa: F401 - registers torch.ops.tilewright.nvfp4_*
from tilewright.errors import InvalidInputError
from tilewright.quant import nvfp4


INFERENCE_ONLY = ("NVFP4Linear layers are inference-only (their input requires grad, and they have no "
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
        return nvfp4.dequantize(nvfp4.NVFP4Tensor(self.weight, self.weight_scale, self.weight_global_scale),
                                self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            raise InvalidInputError(INFERENCE_ONLY)
        lead = x.shape[:-1]
        xq, xs, xg = torch.ops.tilewright.nvfp4_quantize(x.reshape(-1, self.in_features),
                                                         self.input_global_scale)
        y = torch.ops.tilewright.nvfp4_mm(xq, xs, xg, self.weight, self.weight_scale,
                                          self.weight_global_scale, self.bias, x.dtype)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_linears(model: nn.Module, *, skip: tuple[str, ...] = ()) -> int:
    """Replace every ``nn.Linear`` whose in_features is a multiple of 16 (and whose name has none
    of the ``skip`` substrings) by an :class:`NVFP4Linear`, in place. Returns how many."""
    count = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and child.in_features % nvfp4.BLOCK == 0 \
                    and not any(s in full for s in skip):
                setattr(module, child_name, NVFP4Linear.from_linear(child))
                count += 1
    return count
