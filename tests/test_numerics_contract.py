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


# -- item 8: interpreted GEMM stores round to nearest even, as eager's and a GPU's do ------------
def _interpreted_gemm(template_id, problem, params, a, b, *eps):
    from tilewright.runtime.loader import load_module
    from tilewright.runtime.targets import get_target
    from tilewright.templates import get_template

    rendered = get_template(template_id).render(problem, params, get_target("cpu"))
    return load_module(rendered.source, name="rne_gemm", interpret=True).launch(a, b, *eps)


def _err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


ROUNDING_CASES = [  # (template, extra params, store the product too)
    ("triton.gemm", {}, False), ("triton.gemm", {"SPLIT_K": 2}, False),
    ("triton.gemm", {}, True), ("triton.gemm_tma", {}, False),
]


@pytest.mark.parametrize("template_id,extra,store_acc", ROUNDING_CASES,
                         ids=["gemm", "split_k", "store_acc", "gemm_tma"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_interpreted_gemm_stores_round_to_nearest_even_like_eager(template_id, extra, store_acc, dtype):
    """A bf16/fp16 GEMM under the Triton interpreter (the CPU proofs) is as far from float64 as
    eager's (torch CPU: fp32 accumulation, one round-to-nearest-even store), not the 2x of
    the interpreter's truncating fp32 -> bf16 conversion. (Its fp16 conversion goes through
    numpy and already rounds; the fp16 cases hold the contract, the bf16 ones can fail.)"""
    from tilewright.problem import DTYPE_NAMES, EpilogueOp, GemmProblem

    name = DTYPE_NAMES[dtype]
    M, N, K = 64, 48, 96
    a = torch.randn(M, K, generator=_gen(10)).to(dtype)
    b = torch.randn(K, N, generator=_gen(11)).to(dtype)
    exact = a.double() @ b.double()
    epilogue = (EpilogueOp("relu"),) if store_acc else ()
    problem = GemmProblem(M=M, N=N, K=K, dtype=name, epilogue=epilogue, store_acc=store_acc)
    params = {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4,
              "num_stages": 2, **extra}
    out = _interpreted_gemm(template_id, problem, params, a, b)
    outs = [(out[0], exact.relu(), torch.relu(a @ b)), (out[1], exact, a @ b)] if store_acc \
        else [(out, exact, a @ b)]
    for ours, ref, eager in outs:
        assert ours.dtype == dtype
        ratio = _err(ours, ref) / _err(eager, ref)
        assert ratio < 1.2, f"{name} {template_id} {extra}: error {ratio:.2f}x eager's"
