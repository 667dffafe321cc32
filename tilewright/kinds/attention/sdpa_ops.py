"""SDPA calls that PyTorch would run as its math form, made one attention kernel each.

``F.scaled_dot_product_attention`` takes its math path (two matmuls, a materialised softmax,
the probabilities saved for the backward) for

* a float ``attn_mask`` that requires grad: no fused CPU kernel writes the mask's gradient;
* q/k/v of rank > 4 (``(B0, B1, H, S, D)``): the fused kernels take (B, H, S, D) only.

aot_autograd never sees an SDPA op there, only GEMMs and a softmax whose probabilities the
backward reads, so no attention kernel can be lowered. Before aot_autograd traces Dynamo's graph,
:func:`rewrite_sdpa_calls` points its SDPA calls at :func:`sdpa`, which, while tracing,

* flattens the leading batch dims of rank > 4 inputs into one (the mask expanded over them when
  it has them, so its gradient still sums back), calls SDPA on (B, H, S, D) and unflattens;
* gives a mask of rank 1 or 3 leading unit dims up to rank 4 (the fused CPU kernel takes masks of
  rank 2 and 4 only: a ``(1, 1, S)`` mask took the math form);
* sends a call eager computes in the math form with a float mask (any of the above, no dropout,
  no ``is_causal``) to the custom op ``tilewright::sdpa_mask_grad`` (``(out, lse)``: lse base e,
  0 for a row with no finite score, as SDPA's CPU flash kernel), whose backward
  ``tilewright::sdpa_mask_grad_backward`` returns dQ, dK, dV and, when the mask requires grad,
  the gradient of the scores ``ds`` (B, H, Sq, Skv, fp32); the mask's gradient is ``ds`` summed
  to the mask's shape (a reduction the loop kernels compute). Its P is the math form's (a row
  of finfo.min gets 1 / count, where the fused kernels' lse-based P is 1: the problem's
  ``renorm``), so the gradients are eager's for that call;
* calls SDPA otherwise (a boolean mask or none: the fused kernels' gradients are the math
  form's there).

The attention kind lowers both ops like SDPA's own (:mod:`tilewright.kinds.attention.lower`);
their eager implementations here (fp32 math) run only where it does not. Values are eager's:
a row of ``-inf`` gives 0 (SDPA's ``_safe_softmax``), a row of ``finfo.min`` the mean of V.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

SDPA_FUNCTION = F.scaled_dot_product_attention


def _repeat_kv(q: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    g = q.shape[1] // t.shape[1]
    return t if g == 1 else t.repeat_interleave(g, dim=1)


def _scores(q, k, mask, scale):
    s = torch.matmul(q.float(), _repeat_kv(q, k).float().transpose(-1, -2)) * scale
    return s + mask.float()


@torch.library.custom_op("tilewright::sdpa_mask_grad", mutates_args=())
def sdpa_mask_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of ``softmax(scale * q kᵀ + mask) v``.

    Args:
        q: (B, H, Sq, D); k: (B, H_kv, Skv, D); v: (B, H_kv, Skv, Dv), H a multiple of H_kv
            (GQA); one float dtype.
        mask: additive, broadcastable to (B, H, Sq, Skv), q's dtype.
        scale: multiplies q·k.

    Returns out (B, H, Sq, Dv) in q's dtype and lse (B, H, Sq) fp32, base e, 0 for a row whose
    scores are all -inf (whose out is 0).
    """
    s = _scores(q, k, mask, scale)
    lse = torch.logsumexp(s, -1)
    empty = lse == -math.inf
    lse = torch.where(empty, torch.zeros_like(lse), lse)
    # softmax keeps the max apart: a row of finfo.min averages V (lse rounds to the max there)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    out = torch.matmul(p, _repeat_kv(q, v).float())
    return out.to(q.dtype), lse


@sdpa_mask_grad.register_fake
def _(q, k, v, mask, scale):
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("tilewright::sdpa_mask_grad_backward", mutates_args=())
def sdpa_mask_grad_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            mask: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, scale: float,
                            score_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv, ds)`` of :func:`sdpa_mask_grad` from its inputs, ``out``, ``lse`` and the
    output's gradient ``dout`` (B, H, Sq, Dv): dq, dk, dv in their inputs' dtypes; with
    ``score_grad`` ``ds``, the gradient of the masked scores, (B, H, Sq, Skv) fp32 (0 where a
    score is -inf), else an empty tensor. P is the math form's: a row whose lse swallowed
    log(count) (all finfo.min) is renormalised (:data:`reference.SATURATED_LSE`)."""
    from tilewright.kinds.attention.reference import SATURATED_LSE

    s = _scores(q, k, mask, scale)
    p = torch.where(s == -math.inf, torch.zeros_like(s), torch.exp(s - lse[..., None]))
    sat = (lse.abs() > SATURATED_LSE)[..., None]
    p = torch.where(sat, p / p.sum(-1, keepdim=True).clamp_min(1e-30), p)
    vr = _repeat_kv(q, v).float()
    do = dout.float()
    dp = torch.matmul(do, vr.transpose(-1, -2))
    delta = (do * out.float()).sum(-1, keepdim=True)
    ds = p * (dp - delta)
    dq = torch.matmul(ds, _repeat_kv(q, k).float()) * scale
    g = q.shape[1] // k.shape[1]

    def per_kv_head(t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(1, (k.shape[1], g)).sum(2)

    dk = per_kv_head(torch.matmul(ds.transpose(-1, -2), q.float()) * scale)
    dv = per_kv_head(torch.matmul(p.transpose(-1, -2), do))
    # laid out as the fake says (empty_like: q's layout, a transposed view's too), which the
    # traced backward's views of these gradients rely on
    return _like(dq, q), _like(dk, k), _like(dv, v), ds if score_grad else ds.new_empty(0)


def _like(grad: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``grad`` in ``t``'s dtype and in ``torch.empty_like(t)``'s layout (a copy only where the
    layout or dtype differs)."""
    like = torch.empty_like(t)
    if grad.dtype == t.dtype and grad.stride() == like.stride():
        return grad
    return like.copy_(grad)


@sdpa_mask_grad_backward.register_fake
def _(dout, q, k, v, mask, out, lse, scale, score_grad):
    ds = q.new_empty((*q.shape[:-1], k.shape[-2]) if score_grad else (0,), dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), ds


def _setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, mask, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, mask, out, lse)
    ctx.scale = scale


def _backward(ctx: Any, dout: torch.Tensor, dlse: torch.Tensor | None) -> tuple:
    # lse is internal to sdpa() (never returned to the user): it has no gradient of its own
    q, k, v, mask, out, lse = ctx.saved_tensors
    want = bool(ctx.needs_input_grad[3])
    dq, dk, dv, ds = sdpa_mask_grad_backward(dout, q, k, v, mask, out, lse, ctx.scale, want)
    dmask = ds.sum_to_size(mask.shape).to(mask.dtype) if want else None
    return dq, dk, dv, dmask, None


sdpa_mask_grad.register_autograd(_backward, setup_context=_setup)


def _fold_batch(mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    """The mask of rank > 3 expanded over q's leading batch dims and folded into one; a mask
    of rank <= 3 does not reach the batch dims and broadcasts as it is."""
    if mask is None or mask.dim() <= 3:
        return mask
    batch = q.shape[:-3]
    return mask.expand(*batch, *mask.shape[-3:]).flatten(0, -4)


def _fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, dropout_p: float, is_causal: bool,
          enable_gqa: bool) -> bool:
    """Whether :func:`sdpa_mask_grad` computes this call: 4-D, one float dtype, a float
    additive mask of q's dtype, no dropout, no ``is_causal``, GQA only with ``enable_gqa``."""
    return (q.dim() == 4 and k.dim() == 4 and v.dim() == 4 and isinstance(mask, torch.Tensor)
            and mask.is_floating_point() and mask.dtype == q.dtype and mask.dim() <= 4
            and not is_causal and dropout_p == 0.0
            and q.dtype in (torch.float32, torch.float16, torch.bfloat16) and k.dtype == q.dtype == v.dtype
            and (k.shape[1] == q.shape[1] or (enable_gqa and q.shape[1] % k.shape[1] == 0)))


def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
         dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
         enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with the same arguments and values, its math-form cases
    made attention ops (see the module docstring). Raises what SDPA raises."""
    q, k, v, mask = query, key, value, attn_mask
    math_form = False  # what eager computes this call as: its backward's P is a saved softmax
    batch = None
    if q.dim() > 4 and k.dim() == q.dim() and v.dim() == q.dim() and q.shape[:-3] == k.shape[:-3] == v.shape[:-3]:
        batch = q.shape[:-3]
        q, k, v = (t.flatten(0, -4) for t in (q, k, v))
        mask = _fold_batch(mask, query)
        math_form = True
    if q.dim() == 4 and isinstance(mask, torch.Tensor) and mask.dim() in (1, 3):
        mask = mask[(None,) * (4 - mask.dim())]  # broadcasts alike; the fused kernels take rank 2 or 4
        math_form = True
    if isinstance(mask, torch.Tensor) and mask.requires_grad and torch.is_grad_enabled():
        math_form = True
    if math_form and _fits(q, k, v, mask, dropout_p, is_causal, enable_gqa):
        s = float(scale) if scale is not None else 1.0 / math.sqrt(int(q.shape[-1]))
        out = sdpa_mask_grad(q, k, v, mask, s)[0]
    else:  # a bool mask or none: the fused kernels' gradients are the math form's
        out = SDPA_FUNCTION(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                            enable_gqa=enable_gqa)
    return out if batch is None else out.unflatten(0, batch)


def rewrite_sdpa_calls(gm: torch.fx.GraphModule) -> int:
    """Point the SDPA calls of Dynamo's graph ``gm`` at :func:`sdpa`, in place; returns how
    many. Only calls whose traced inputs take SDPA's math form are changed: rank > 4 inputs, a
    mask of rank 1 or 3, or a float mask that requires grad."""
    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not SDPA_FUNCTION:
            continue
        vals = [a.meta.get("example_value") if isinstance(a, torch.fx.Node) else None for a in node.args[:3]]
        mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
        mval = mask.meta.get("example_value") if isinstance(mask, torch.fx.Node) else None
        if not all(isinstance(v, torch.Tensor) for v in vals):
            continue
        wide = any(v.dim() > 4 for v in vals)
        odd_mask = isinstance(mval, torch.Tensor) and (mval.requires_grad or mval.dim() in (1, 3))
        if wide or odd_mask:
            node.target = sdpa
            count += 1
    if count:
        gm.recompile()
    return count


__all__ = ["rewrite_sdpa_calls", "sdpa", "sdpa_mask_grad", "sdpa_mask_grad_backward"]
