"""Corner cases found by replaying public torch.compile bug reports with generated kernels
forced (issue 21): each test is named after its bug and failed before the fix. Triton runs in
the interpreter here; every output is compared with eager (float64 where it is a float)."""

from __future__ import annotations

import warnings

import pytest
import torch

import tilewright
from loop_check import (
    BF16, FAST, check_against_eager, loop_kernels, randn, run_triton,
)
from test_loop_kernels import FACTORY, loop_problems
from tilewright.autotune.kinds import make_loop_inputs
from tilewright.compiler.report import collect_reports
from tilewright.errors import InvalidInputError


def test_log1p_of_inf_is_inf_not_nan_and_argmax_after_it_is_not_fooled():
    # the interpreter's log1p helper computed inf * (inf / inf) at +inf; argmax then pointed at
    # that fake NaN
    x = torch.tensor([[0.5, float("inf"), 2.0, -0.5], [1.0, 3.0, float("inf"), 0.0]])
    out, _ = run_triton(lambda a: (torch.log1p(a), torch.log1p(a).argmax(1)), x)
    assert torch.equal(out[0], torch.log1p(x)) or torch.allclose(out[0], torch.log1p(x))
    assert torch.isinf(out[0][0, 1]) and out[0][0, 1] > 0
    assert out[1].tolist() == [1, 2]


@pytest.mark.parametrize("perm,dim", [((2, 0, 1), 1), ((1, 2, 0), 1), ((2, 1, 0), 0), ((0, 2, 1), 2)])
def test_argmax_over_one_dim_of_a_permuted_3d_tensor_compiles_and_matches(perm, dim):
    # the torch form (the reference and the ATen candidate) wrote .view(-1, -1, 1) for the two
    # outer dims: "only one dimension can be inferred", so no candidate passed and the graph
    # fell back to ATen
    x = randn(3, 4, 5)
    check_against_eager(lambda a: (a.permute(*perm).argmax(dim), a.permute(*perm).argmin(dim)), x)
    for problem in loop_problems(lambda a: a.permute(*perm).argmax(dim), x):
        FACTORY.reference(problem, make_loop_inputs(problem, "cpu", seed=1))  # renders and runs


ZERO_DIM = {
    "sum": lambda a: a.sum(0),
    "sum_keepdim": lambda a: a.sum(-1, keepdim=True),
    "amax": lambda a: a.amax(-1),
    "argmax": lambda a: a.argmax(0),
    "argmin_keepdim": lambda a: a.argmin(-1, keepdim=True),
    "softmax": lambda a: a.softmax(-1),
    "log_softmax": lambda a: a.log_softmax(0),
    "var_mean_correction_0": lambda a: torch.var_mean(a, 0, correction=0),
    "var_mean_correction_1": lambda a: torch.var_mean(a, -1, correction=1),  # 0/0: NaN, as eager
    "prod_any": lambda a: (a.prod(0), (a > 0).any(-1)),
}


@pytest.mark.parametrize("name", sorted(ZERO_DIM))
def test_reducing_a_0d_tensor_over_dim_0_or_minus_1_compiles_and_matches(name):
    # lowering read x.shape[0] of a 0-d tensor (IndexError): the whole graph fell back to ATen
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # eager's var of one element warns
        check_against_eager(ZERO_DIM[name], torch.tensor(2.5))


def test_interpreted_bf16_casts_keep_subnormals():
    # the Triton interpreter's own fp32 <-> bf16 conversion flushed or mangled subnormals
    # (1e-40 became 0, the largest bf16 subnormal 1.166e-38 became 1.139e-38): loop kernels
    # now convert bf16 by its bits under the interpreter
    x = torch.tensor([1e-40, -1e-40, 9.2e-41, 1.16e-38, -1.16e-38, 5e-39, 1.0, 0.0])
    out, _ = run_triton(lambda a: (a * 1.0).to(BF16), x)
    assert torch.equal(out.view(torch.int16), x.to(BF16).view(torch.int16))
    h = x.to(BF16)
    out, _ = run_triton(lambda a: a.float() * 2.0, h)
    assert torch.equal(out, h.float() * 2.0)


def test_a_complex_intermediate_stays_on_aten_and_the_rest_compiles():
    # computation_dtype met torch.complex64 (KeyError in ir/dtypes.py): the whole graph, its
    # GEMM included, went to ATen; now only the complex op does
    x, w = randn(4, 16), randn(9, 9, seed=1)
    with tilewright.config.patch(**FAST), collect_reports() as reports:
        out = torch.compile(lambda a, b: (torch.fft.rfft(a).abs() @ b).relu(), backend="tilewright")(x, w)
    (r,) = reports
    assert r.fallback is None, r.fallback
    assert r.gemm_nodes == 1
    assert torch.allclose(out, (torch.fft.rfft(x).abs() @ w).relu(), atol=1e-5)
    out, reports = run_triton(lambda a: torch.view_as_complex(a.reshape(4, 8, 2)).abs() * 2 + 1, x)
    assert loop_kernels(reports) == 1
    assert torch.allclose(out, torch.view_as_complex(x.reshape(4, 8, 2)).abs() * 2 + 1)


@pytest.mark.parametrize("offs", [[8, 4, 12, 16], [-4, 8, 12, 16], [4, 8, 6, 16]])
def test_grouped_mm_with_offsets_out_of_order_or_negative_is_refused_on_the_host(offs):
    # the kernels clamp such offsets and computed rows with another expert than eager does
    # (rows 4-7 of [8, 4, 12, 16]), silently; host offsets are checked (no device sync needed)
    from tilewright.kernels.grouped import grouped_mm

    a, b = randn(16, 16, dtype=BF16), randn(4, 16, 8, dtype=BF16, seed=1)
    with tilewright.config.patch(**FAST), pytest.raises(InvalidInputError, match="non-decreasing"):
        grouped_mm(a, b, torch.tensor(offs, dtype=torch.int32))
    # empty groups (a repeated offset) and offsets past the total are fine, as in eager
    ok = torch.tensor([4, 4, 12, 16], dtype=torch.int32)
    with tilewright.config.patch(**FAST):
        got = grouped_mm(a, b, ok)
    assert torch.allclose(got.float(), torch._grouped_mm(a, b, ok).float(), atol=0.1, rtol=0.02)


def test_masked_fill_with_a_mask_from_a_cat_fuses_into_the_gather_cat_kernel():
    # the torch form loaded a boolean through a cat's masked load as where(mask, x, 0): int64,
    # no longer a condition; every candidate failed its check and the group split apart
    x, y = randn(10, 6), randn(4, 3, seed=2)
    idx = torch.tensor([3, 0, 9, 5])
    m = torch.rand(4, 9, generator=torch.Generator().manual_seed(3)) > 0.5

    def fn(x, i, y, m):
        mask = torch.cat([m[:, :6], m[:, 6:]], 1)
        return torch.cat([x[i], y], 1).masked_fill(mask, 0.0), torch.cat([x[i].masked_fill(m[:, :6], -1.0), y], 1)
    check_against_eager(fn, x, idx, y, m, kernels=1)


def test_allocations_are_not_counted_as_launches():
    # empty_like / new_empty run no kernel: a Qwen3-MoE's two empty_like counted as launches
    with tilewright.config.patch(**FAST), collect_reports() as reports:
        torch.compile(lambda a: (a.sin() * 2, torch.empty_like(a), a.new_empty(3, 4),
                                 torch.empty(2, 2, dtype=torch.int64)), backend="tilewright")(randn(5, 7))
    (r,) = reports
    assert r.extern_nodes == 3 and r.extern_ops == 0
    assert r.launches == r.loop_kernels == 1
    assert r.eager_launches == 2  # sin, mul
