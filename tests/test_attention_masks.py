"""Masks as users write them, as generated attention kernels forward and backward: a float mask
that requires grad (its gradient too), 5-D q/k/v with a broadcast bool or float mask, masks of
rank 3, rows fully masked with ``finfo.min`` (eager's softmax of equal scores: the mean of V,
and the math form's gradients) or ``-inf`` (0, as eager). Eager runs these as SDPA's math form
(GEMMs and a saved softmax); the compiled graph runs one attention kernel each way
(``kinds/attention/sdpa_ops.py``). Judged against the float64 math form and against eager."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import tilewright
from tilewright.compiler.report import collect_reports

TOL = 1e-4  # fp32


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.detach().double(), ref.detach().double()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


def sdpa(q, k, v, m, gqa=False):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=gqa)


def compiled_grads(fn, leaves, go):
    """(output, gradients of ``leaves``, graph reports) of ``fn`` compiled with generated kernels
    forced."""
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(fn, backend="tilewright")(*leaves)
        grads = torch.autograd.grad(out, [t for t in leaves if t.requires_grad], go)
    return out, grads, reports


def float64_grads(fn, leaves, go):
    d64 = [t.detach().double().requires_grad_(t.requires_grad) if t.is_floating_point() else t for t in leaves]
    out = fn(*d64)
    return out, torch.autograd.grad(out, [t for t in d64 if t.requires_grad], go.double())


def assert_attention_kernels_only(reports):
    """One generated attention kernel in the forward and one in the backward, nothing on ATen."""
    by_kind = {r.kind: r for r in reports}
    assert set(by_kind) == {"forward", "backward"}, [r.kind for r in reports]
    for kind, template in (("forward", "triton.attention["), ("backward", "triton.attention_bwd[")):
        r = by_kind[kind]
        att = [k for k in r.kernels if k.kind == "attention"]
        assert len(att) == 1 and att[0].winner.startswith(template), [(k.kind, k.winner) for k in r.kernels]
        assert r.extern_ops == 0 and r.fallback is None and not r.kernel_fallbacks, (r.extern_ops, r.fallback)


def check(fn, leaves, eager_tol=1e-5):
    out_e = fn(*leaves)
    go = torch.randn_like(out_e)
    grads_e = torch.autograd.grad(out_e, [t for t in leaves if t.requires_grad], go)
    out, grads, reports = compiled_grads(fn, leaves, go)
    ref, want = float64_grads(fn, leaves, go)
    assert_attention_kernels_only(reports)
    assert rel_err(out, ref) < TOL
    torch.testing.assert_close(out, out_e, rtol=eager_tol, atol=eager_tol)
    for g, w, e in zip(grads, want, grads_e):
        assert torch.equal(g.isnan(), e.isnan()) and not g.isnan().any()
        assert rel_err(g, w) < TOL, rel_err(g, w)
        torch.testing.assert_close(g, e, rtol=eager_tol, atol=eager_tol)
    return out, grads


@pytest.mark.parametrize("fill", ["finfo_min", "-inf"])
def test_a_float_mask_requiring_grad_is_one_attention_kernel_each_way(fill):
    """GQA SDPA with a (B, 1, Sq, Skv) float mask that requires grad, rows fully masked: the
    forward and the backward are one generated attention kernel each (the backward writes the
    scores' gradient; the mask's is its sum over heads), eager's values and gradients. Before,
    the math form's GEMMs and softmax ran, probabilities saved; a finfo.min row's P from the
    saturated lse was 1, not 1 / Skv (gradients off by 2.3 relative)."""
    torch.manual_seed(10)
    value = torch.finfo(torch.float32).min if fill == "finfo_min" else -math.inf
    q = torch.randn(2, 4, 6, 16, requires_grad=True)
    k, v = (torch.randn(2, 2, 9, 16, requires_grad=True) for _ in range(2))
    m = torch.randn(2, 1, 6, 9)
    m[0, :, 1] = value
    m[1, :, 4] = value
    m[1, :, 2, 3] = value
    m.requires_grad_()
    out, grads = check(lambda q, k, v, m: sdpa(q, k, v, m, gqa=True), (q, k, v, m))
    if fill == "finfo_min":
        torch.testing.assert_close(out[0, :, 1], v[0].mean(1).repeat_interleave(2, 0), rtol=1e-5, atol=1e-6)
    else:
        assert out[0, :, 1].eq(0).all() and grads[3][0, :, 1].eq(0).all()


def test_a_rank_2_mask_requiring_grad_over_non_contiguous_inputs():
    """q, k, v transposed views of (B, S, H, D) tensors (as a model's projections give them), a
    (Sq, Skv) mask requiring grad, lengths off the block."""
    torch.manual_seed(11)
    q0 = torch.randn(3, 5, 2, 16, requires_grad=True)
    k0, v0 = (torch.randn(3, 11, 2, 16, requires_grad=True) for _ in range(2))
    m = torch.randn(5, 11, requires_grad=True)

    def f(q0, k0, v0, m):
        return sdpa(q0.transpose(1, 2), k0.transpose(1, 2), v0.transpose(1, 2), m)

    check(f, (q0, k0, v0, m))


def test_5d_inputs_with_a_broadcast_bool_mask_are_attention_kernels():
    """(B0, B1, H, S, D) q/k/v with a (1, 1, S) boolean mask (eager: the math form): folded to
    (B0 B1, H, S, D), the mask given rank 4 (the fused kernels take rank 2 or 4)."""
    torch.manual_seed(12)
    q, k, v = (torch.randn(2, 3, 2, 7, 16, requires_grad=True) for _ in range(3))
    m = torch.rand(1, 1, 7) < 0.7
    m[..., 0] = True
    check(sdpa, (q, k, v, m))


def test_5d_inputs_with_a_batched_float_mask_requiring_grad():
    """A (1, B1, 1, Sq, Skv) float mask over 5-D inputs, requiring grad, a finfo.min row: the
    mask expanded over the batch dims and folded with them, its gradient summed back."""
    torch.manual_seed(13)
    q = torch.randn(2, 3, 2, 5, 16, requires_grad=True)
    k, v = (torch.randn(2, 3, 2, 6, 16, requires_grad=True) for _ in range(2))
    m = torch.randn(1, 3, 1, 5, 6)
    m[0, 1, 0, 2] = torch.finfo(torch.float32).min
    m.requires_grad_()
    check(sdpa, (q, k, v, m))


def test_a_mask_requiring_grad_after_an_automatic_dynamic_length_change():
    """The same call at a second and a third length: Dynamo makes the lengths dynamic; the
    dynamic graph's forward and backward are attention kernels with symbolic lengths."""
    torch.manual_seed(14)
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        cf = torch.compile(sdpa, backend="tilewright")
        for S in (6, 9, 13):
            q, k, v = (torch.randn(2, 2, S, 16, requires_grad=True) for _ in range(3))
            m = torch.randn(2, 1, S, S, requires_grad=True)
            go = torch.randn(2, 2, S, 16)
            grads = torch.autograd.grad(cf(q, k, v, m), (q, k, v, m), go)
            _, want = float64_grads(sdpa, (q, k, v, m), go)
            for g, w in zip(grads, want):
                assert rel_err(g, w) < TOL
    dyn = [k for r in reports for k in r.kernels if k.kind == "attention" and "dynamic" in k.problem]
    assert sorted(k.problem.split()[1] for k in dyn) == ["backward", "forward"], [k.problem for k in dyn]
    assert all(k.winner.startswith("triton.attention") for k in dyn)
    assert all(r.extern_ops == 0 and r.fallback is None for r in reports)


@pytest.mark.parametrize("causal", [False, True])
def test_the_backward_kernel_writes_the_scores_gradient_and_renormalises_saturated_rows(causal):
    """``triton.attention_bwd`` for a ``score_grad`` + ``renorm`` problem in the interpreter,
    outputs poisoned: dq, dk, dv and ds against the float64 reference, with GQA, lengths off the
    block, an additive mask with a row of finfo.min (its P 1 / Skv, not exp(s - lse) = 1) and,
    causal, the key tiles past the diagonal never visited (their ds 0)."""
    from tilewright.kinds.attention import checks, mods
    from tilewright.kinds.attention.problem import AttentionProblem, Capture
    from tilewright.runtime.loader import load_module
    from tilewright.runtime.targets import get_target
    from tilewright.templates import get_template

    cpu = get_target("cpu")
    shape = (2, 1, 19, 23)
    p = AttentionProblem(B=2, H=4, H_kv=2, Sq=19, Skv=23, D=16, Dv=16, dtype="fp32", scale=0.3,
                         direction="backward", causal=causal, empty_lse=0.0, score_grad=True, renorm=True,
                         score_mod=mods.dumps(mods.additive_mask(0, shape, "fp32")),
                         captures=(Capture(shape, "fp32"),))
    t = get_template("triton.attention_bwd")
    params = t.space.complete(dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1))
    assert t.supports(p, cpu) and t.check(params, p, cpu) is None
    rendered = t.render(p, params, cpu)
    launch = load_module(rendered.source, name=rendered.name, interpret=True).launch
    x = checks.make_inputs(p, "cpu", seed=5)
    mask = x.get("c0")
    mask[1, 0, 7] = torch.finfo(torch.float32).min
    fwd = dataclasses.replace(p, direction="forward", score_grad=False, renorm=False)
    from tilewright.kinds.attention import reference as ref

    out, lse = ref.forward(fwd, x.get("q"), x.get("k"), x.get("v"), [mask], reference=True)
    x.tensors[x.names.index("out")] = out.float()
    x.tensors[x.names.index("lse")] = lse.float()
    assert lse[1, :, 7].abs().min() > 1e30  # saturated: max + log(23) rounds to the max
    result = checks.run(launch, x, checks.poisoned(p, "cpu"))
    expected = checks.reference(p, x)
    assert len(result) == 4 and not any(o.isnan().any() for o in result)
    worst, tol = checks.error(p, result, expected, False)
    assert worst <= tol, [checks.rel_error(o, r) for o, r in zip(result, expected)]
    if causal:
        assert result[3][..., torch.ones(19, 23, dtype=torch.bool).tril().logical_not()].eq(0).all()
