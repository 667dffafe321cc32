"""The public op ``tilewright.kernels.gemm`` / ``torch.ops.tilewright.gemm``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_err

import tilewright
from tilewright.errors import InvalidInputError
from tilewright.kernels import gemm


@pytest.mark.parametrize("mode", ["auto", "triton"])
def test_bias_activation_residual(mode):
    a, w = torch.randn(19, 24), torch.randn(31, 24)
    bias, res = torch.randn(31), torch.randn(19, 31)
    with tilewright.config.patch(force_backend=mode):
        out = gemm(a, w.t(), bias, activation="silu", residual=res, alpha=0.5)
    ref = F.silu(0.5 * a.double() @ w.double().t() + bias.double()) + res.double()
    assert rel_err(out, ref) < 1e-5


def test_batched_and_out_dtype():
    a, b = torch.randn(3, 9, 16, dtype=torch.bfloat16), torch.randn(3, 16, 12, dtype=torch.bfloat16)
    with tilewright.config.patch(force_backend="triton"):
        out = gemm(a, b, out_dtype=torch.float32)
    assert out.dtype == torch.float32 and out.shape == (3, 9, 12)
    assert rel_err(out, a.double() @ b.double()) < 1e-2


@pytest.mark.parametrize("args,kwargs,match", [
    ((torch.randn(4, 5), torch.randn(4, 5)), {}, r"last dim \(K=5\).*weight.t\(\)"),
    ((torch.randn(4, 5), torch.randn(5, 3, dtype=torch.float16)), {}, "cast one of them"),
    ((torch.randn(4), torch.randn(4, 3)), {}, "must be 2-D"),
    ((torch.randint(0, 3, (4, 5)), torch.randint(0, 3, (5, 3))), {}, "not supported"),
    ((torch.randn(4, 5), torch.randn(5, 3), torch.randn(7)), {}, "does not broadcast"),
    ((torch.randn(4, 5), torch.randn(5, 3)), {"activation": "swish"}, "activation 'swish' unknown"),
    ((torch.randn(4, 5), torch.randn(5, 3)), {"out_dtype": torch.int32}, "out_dtype"),
])
def test_bad_input_is_named_with_its_fix(args, kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        gemm(*args, **kwargs)


def test_meta_device_mismatch_is_caught():
    with pytest.raises(InvalidInputError, match="move them to one device"):
        gemm(torch.randn(4, 5), torch.randn(5, 3, device="meta"))


def test_inside_other_backends_with_fullgraph():
    w, bias = torch.randn(8, 6), torch.randn(8)

    def f(x):
        return gemm(x, w.t(), bias, activation="gelu") * 2

    x = torch.randn(5, 6)
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    assert rel_err(out, 2 * F.gelu(x.double() @ w.double().t() + bias.double())) < 1e-5


def test_gradients():
    a = torch.randn(6, 7, requires_grad=True)
    w = torch.randn(5, 7, requires_grad=True)
    bias = torch.randn(5, requires_grad=True)
    gemm(a, w.t(), bias, alpha=2.0).square().sum().backward()
    a2, w2, b2 = (t.detach().clone().requires_grad_() for t in (a, w, bias))
    (2.0 * a2 @ w2.t() + b2).square().sum().backward()
    for x, y in ((a, a2), (w, w2), (bias, b2)):
        assert rel_err(x.grad, y.grad) < 1e-5


def test_batched_a_with_shared_2d_b_and_bias():
    """Regression: the ATen candidate called baddbmm with a 2-D b."""
    a, w, bias = torch.randn(2, 8, 32), torch.randn(16, 32), torch.randn(16)
    for mode in ("auto", "aten"):
        with tilewright.config.patch(force_backend=mode):
            out = gemm(a, w.t(), bias)
        assert rel_err(out, a.double() @ w.double().t() + bias.double()) < 1e-5


@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"])
def test_gradients_through_every_activation(activation):
    a = torch.randn(6, 7, dtype=torch.float64).float().requires_grad_()
    w = torch.randn(5, 7).requires_grad_()
    bias, res = torch.randn(5, requires_grad=True), torch.randn(6, 5, requires_grad=True)
    gemm(a, w.t(), bias, activation=activation, residual=res, alpha=0.5).square().sum().backward()
    ref_in = [t.detach().clone().requires_grad_() for t in (a, w, bias, res)]
    act = {"none": lambda z: z, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
           "relu": torch.relu, "gelu": F.gelu, "silu": F.silu, "sigmoid": torch.sigmoid,
           "tanh": torch.tanh}[activation]
    a2, w2, b2, r2 = ref_in
    (act(0.5 * a2 @ w2.t() + b2) + r2).square().sum().backward()
    for x, y in zip((a, w, bias, res), ref_in):
        assert rel_err(x.grad, y.grad) < 1e-5, activation
