"""Numerics match eager's contract at the edges (NaN and infinite scales, skipped terms)."""

from __future__ import annotations

import pytest
import torch

import tilewright
from tilewright.kernels import gemm


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("mode", ["auto", "triton"])
@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), -float("inf"), 0.0])
def test_gemm_with_a_nan_or_infinite_alpha_returns_what_ieee_arithmetic_does(fresh_cache, mode, alpha):
    a, b = torch.randn(8, 16, generator=_gen(0)), torch.randn(16, 12, generator=_gen(1))
    with tilewright.config.patch(force_backend=mode):
        out = gemm(a, b, alpha=alpha)
    ref = alpha * (a.double() @ b.double())
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    finite = ~torch.isnan(ref)
    torch.testing.assert_close(out[finite].double(), ref[finite], rtol=1e-5, atol=1e-5)


def test_gemm_activation_none_means_no_activation(fresh_cache):
    a, b = torch.randn(5, 7, generator=_gen(2)), torch.randn(7, 3, generator=_gen(3))
    torch.testing.assert_close(gemm(a, b, activation=None), a @ b)


def test_addmm_with_alpha_zero_skips_the_product_as_eager_does():
    # NaN in A times alpha=0 is NaN in arithmetic, but the BLAS (and eager) skip the product
    x = torch.randn(6, 8, generator=_gen(4))
    x[0, 0] = float("nan")
    w, bias = torch.randn(8, 5, generator=_gen(5)), torch.randn(5, generator=_gen(6))
    fn = lambda bias, x, w: torch.addmm(bias, x, w, alpha=0) * 2  # noqa: E731
    torch._dynamo.reset()
    out = torch.compile(fn, backend="tilewright")(bias, x, w)
    assert torch.equal(out, fn(bias, x, w))


def test_a_bias_that_does_not_broadcast_is_refused_with_the_fix():
    a, b = torch.randn(8, 16), torch.randn(16, 12)
    with pytest.raises(Exception, match="does not broadcast"):
        gemm(a, b, torch.randn(5))
