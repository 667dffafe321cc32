"""The layout of an SDPA gradient when the attention kernel runs ATen's form (or the custom op's
eager form, the graph-level fallback): dq/dk/dv come back as the traced graph laid them out
(the fake's ``empty_like(q)``), not contiguous. q from a linear's (B, S, H, D) view transposed
(as T5's and most models' projections give it) has a transposed layout; the backward views its
gradient back to (B*S, H*D) after transposing it, which a contiguous dq cannot give: T5's
training step raised "view size is not compatible with input tensor's size and stride" (its
relative position bias is a float mask that requires grad)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tilewright
from conftest import rel_err
from tilewright.kinds.attention.sdpa_ops import sdpa_mask_grad, sdpa_mask_grad_backward

B, S, H, D = 2, 7, 4, 16


def _model(x, w, m):
    q = (x @ w).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D), strides of (B, S, H, D)
    o = F.scaled_dot_product_attention(q, q, q, attn_mask=m)
    return o.transpose(1, 2).reshape(B, S, H * D).square().sum()


@pytest.mark.parametrize("backend", ["aten", "auto"])
def test_sdpa_with_a_grad_mask_over_a_transposed_projection_trains(backend):
    torch.manual_seed(0)
    x = torch.randn(B, S, H * D, requires_grad=True)
    w = (torch.randn(H * D, H * D) / 8).requires_grad_()
    m = torch.randn(1, H, S, S, requires_grad=True)
    leaves = (x, w, m)
    ref = [t.detach().double().requires_grad_() for t in leaves]
    want = torch.autograd.grad(_model(*ref), ref)
    with tilewright.config.patch(graph_race="off", force_backend=backend, strict=True):
        got = torch.autograd.grad(torch.compile(_model, backend="tilewright")(*leaves), leaves)
    for g, r in zip(got, want):
        assert rel_err(g, r) < 1e-4


def test_the_custom_ops_eager_gradients_have_the_fakes_layout():
    torch.manual_seed(1)
    q, k, v = (torch.randn(B, S, H, D).transpose(1, 2) for _ in range(3))
    mask = torch.randn(1, H, S, S)
    out, lse = sdpa_mask_grad(q, k, v, mask, 0.25)
    dout = torch.randn_like(out)
    dq, dk, dv, _ = sdpa_mask_grad_backward(dout, q, k, v, mask, out, lse, 0.25, True)
    for g, t in zip((dq, dk, dv), (q, k, v)):
        assert g.stride() == torch.empty_like(t).stride()


def _forward_view(x, w, m):
    q = (x @ w).view(B, S, H, D).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, q, q, attn_mask=m)
    return o.reshape(B * H, S, D) * 2  # a view where o is laid out (B, H, S, D) as traced


@pytest.mark.parametrize("backend", ["aten", "auto"])
def test_sdpa_with_a_grad_mask_forward_output_keeps_the_traced_layout(backend):
    torch.manual_seed(2)
    x, w = torch.randn(B, S, H * D), torch.randn(H * D, H * D) / 8
    m = torch.randn(1, H, S, S, requires_grad=True)
    want = _forward_view(x.double(), w.double(), m.detach().double())
    with tilewright.config.patch(graph_race="off", force_backend=backend, strict=True):
        got = torch.compile(_forward_view, backend="tilewright")(x, w, m)
    assert rel_err(got, want) < 1e-4
