"""GEMMs that store their product beside the epilogue (GemmProblem.store_acc)."""

from __future__ import annotations

import pytest
import torch

import tilewright
from tilewright.compiler.report import collect_reports
from tilewright.problem import EpilogueOp, GemmProblem


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _run(fn, args, mode):
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend=mode, strict=True), collect_reports() as reports:
        out = torch.compile(fn, backend="tilewright")(*args)
    return out, reports


@pytest.mark.parametrize("mode", ["cpp", "triton"])  # auto on a CPU leaves epilogues to loop kernels
def test_a_saved_product_still_fuses_its_epilogue(mode):
    def fn(x, w1, w2, r):
        gate = x @ w1  # returned too: needed beside the epilogue's result
        return torch.nn.functional.silu(gate) * (x @ w2) + r, gate

    args = [torch.randn(s, generator=_gen(i)) for i, s in enumerate([(9, 16), (16, 24), (16, 24), (9, 24)])]
    out, reports = _run(fn, args, mode)
    ref = fn(*[a.double() for a in args])
    assert all(_rel(o, r) < 1e-5 for o, r in zip(out, ref))
    (report,) = reports
    assert report.launches == 2 and report.loop_kernels == 0
    assert any(g.epilogue.startswith("(store acc)") for g in report.gemms)
    if mode == "triton":  # the one template that stores the product too
        assert all(g.winner.startswith("triton.gemm[") for g in report.gemms if g.epilogue.startswith("(store"))


def test_the_product_is_never_an_operand_of_its_own_epilogue():
    # relu(mm) + mm: the second operand is the value being computed, not an input
    def fn(x, w):
        y = x @ w
        return torch.relu(y) + y, y

    args = [torch.randn(7, 12, generator=_gen(0)), torch.randn(12, 10, generator=_gen(1))]
    out, _ = _run(fn, args, "triton")
    ref = fn(*[a.double() for a in args])
    assert all(_rel(o, r) < 1e-5 for o, r in zip(out, ref))


def test_training_a_gated_mlp_stores_the_gate_and_matches_eager():
    torch.manual_seed(0)
    lin = torch.nn.ModuleList([torch.nn.Linear(16, 32, bias=False) for _ in range(3)])

    def fn(x):
        return (torch.nn.functional.silu(lin[0](x)) * lin[1](x)) @ lin[2].weight

    x = torch.randn(6, 16, requires_grad=True, generator=_gen(2))
    # a forced backend: in auto mode a CPU GEMM leaves its epilogue to the loop kernels
    with tilewright.config.patch(strict=True, force_backend="cpp"), collect_reports() as reports:
        torch._dynamo.reset()
        out = torch.compile(fn, backend="tilewright")(x)
        out.square().sum().backward()
    grads = [x.grad.clone()] + [p.grad.clone() for p in lin.parameters()]
    x.grad = None
    for p in lin.parameters():
        p.grad = None
    ref = fn(x)
    ref.square().sum().backward()
    assert _rel(out, ref) < 1e-5
    for g, r in zip(grads, [x.grad] + [p.grad for p in lin.parameters()]):
        assert _rel(g, r) < 1e-5
    fwd = next(r for r in reports if r.kind == "forward")
    assert any(g.epilogue.startswith("(store acc)") for g in fwd.gemms), [g.epilogue for g in fwd.gemms]


def test_store_acc_is_part_of_the_key_and_absent_keys_are_unchanged():
    plain = GemmProblem(M=8, N=8, K=8, dtype="fp32", epilogue=(EpilogueOp("relu"),))
    stored = GemmProblem(M=8, N=8, K=8, dtype="fp32", epilogue=(EpilogueOp("relu"),), store_acc=True)
    assert "store_acc" not in plain.to_json()
    assert plain.stable_hash() != stored.stable_hash()
    assert GemmProblem.from_json(stored.to_json()) == stored
    with pytest.raises(ValueError, match="store_acc needs float operands"):
        GemmProblem(M=16, N=16, K=16, dtype="nvfp4", scale_layout="row", store_acc=True)


@pytest.mark.parametrize("mode", ["cpp", "triton"])  # auto on a CPU leaves epilogues to loop kernels
def test_a_saved_linear_with_bias_still_fuses_its_activation_in_training(mode):
    """nn.Linear (addmm: the product plus its bias) saved for the backward, then GELU: one
    GEMM stores acc + bias and the GELU of it (found by a new-user trial: it was two kernels)."""
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)
    params = [*lin1.parameters(), *lin2.parameters()]

    def fn(x):
        return lin2(torch.nn.functional.gelu(lin1(x)))

    x = torch.randn(6, 16, requires_grad=True, generator=_gen(3))
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend=mode, strict=True), collect_reports() as reports:
        out = torch.compile(fn, backend="tilewright")(x)
        out.square().sum().backward()
    got = [x.grad.clone()] + [p.grad.clone() for p in params]
    x.grad = None
    for p in params:
        p.grad = None
    ref = fn(x)
    ref.square().sum().backward()
    assert _rel(out, ref) < 1e-5
    assert all(_rel(g, r) < 1e-5 for g, r in zip(got, [x.grad] + [p.grad for p in params]))
    fwd = next(r for r in reports if r.kind == "forward")
    assert fwd.launches == 2 and fwd.gemms[0].epilogue == "(store acc) add[N] → gelu"
