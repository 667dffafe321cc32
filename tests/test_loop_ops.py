"""Every ATen op the loop lowering handles, compiled into generated Triton loop kernels (the
interpreter on this CPU) and checked against eager in float64: pointwise math, comparisons,
casts, activations and their backward formulas, views and data movement, gathers, reductions,
softmax and the norms; in fp32/fp16/bf16, on non-contiguous, broadcast, odd-sized and empty
inputs. The kernels themselves, rendered per LoopProblem, are in test_loop_kernels.py."""

from __future__ import annotations

import pytest
import torch

import tilewright
from loop_check import (
    BF16, F, FAST, FP16, FP32, LOW, REL_TOL, SHAPE, assert_on_triton, check_against_eager,
    check_training, ints, nonzero_ints, positive, randn, rel_error, run_triton, unit,
)
from tilewright.compiler.report import collect_reports


# -- pointwise math --------------------------------------------------------------------------
# op -> input maker (its domain)
UNARY = {
    "exp": randn, "exp2": randn, "expm1": randn, "log": positive, "log2": positive,
    "log10": positive, "log1p": positive, "sqrt": positive, "rsqrt": positive, "sin": randn,
    "cos": randn, "tan": unit, "asin": unit, "acos": unit, "atan": lambda *s, **k: randn(*s, scale=3.0, **k),
    "sinh": randn, "cosh": randn, "tanh": randn, "sigmoid": randn, "erf": randn, "erfinv": unit,
    "reciprocal": positive, "abs": randn, "neg": randn, "sign": randn,
    "floor": lambda *s, **k: randn(*s, scale=4.0, **k), "ceil": lambda *s, **k: randn(*s, scale=4.0, **k),
    "trunc": lambda *s, **k: randn(*s, scale=4.0, **k), "round": lambda *s, **k: randn(*s, scale=4.0, **k),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_math_matches_eager_fp32(name):
    fn = getattr(torch, name)
    check_against_eager(lambda a: fn(a), UNARY[name](*SHAPE), kernels=1)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", ["exp", "log1p", "rsqrt", "sin", "tanh", "sigmoid", "erf", "atan"])
def test_unary_math_matches_eager_in_half_precision(name, dtype):
    fn = getattr(torch, name)
    check_against_eager(lambda a: fn(a), UNARY[name](*SHAPE, dtype=dtype), kernels=1)


def test_round_is_half_to_even():
    check_against_eager(torch.round, torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4, -2.6, 3.5]))


BINARY = {
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=2.5), randn, randn),
    "sub": (lambda a, b: a - b, randn, randn),
    "rsub_scalar": (lambda a, b: 1.5 - a + b, randn, randn),
    "rsub_alpha": (lambda a, b: torch.rsub(a, b, alpha=2), randn, randn),  # other - alpha * self
    "sub_alpha": (lambda a, b: torch.sub(a, b, alpha=-0.5), randn, randn),
    "mul": (lambda a, b: a * b, randn, randn),
    "div": (lambda a, b: a / b, randn, positive),
    "floor_divide": (lambda a, b: torch.div(a, b, rounding_mode="floor"), lambda *s, **k: randn(*s, scale=5.0, **k), randn),
    "trunc_divide": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), lambda *s, **k: randn(*s, scale=5.0, **k), randn),
    "remainder": (torch.remainder, lambda *s, **k: randn(*s, scale=5.0, **k), randn),
    "fmod": (torch.fmod, lambda *s, **k: randn(*s, scale=5.0, **k), randn),
    "pow": (torch.pow, positive, randn),
    "maximum": (torch.maximum, randn, randn),
    "minimum": (torch.minimum, randn, randn),
    "atan2": (torch.atan2, randn, randn),
    "copysign": (torch.copysign, randn, randn),
    "addcmul": (lambda a, b: torch.addcmul(a, b, a, value=0.5), randn, randn),
    "addcdiv": (lambda a, b: torch.addcdiv(a, a, b, value=0.5), randn, positive),
    "lerp": (lambda a, b: torch.lerp(a, b, 0.3), randn, randn),
}


@pytest.mark.parametrize("other_shape", [(13,), (7, 1)], ids=["row", "column"])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_math_with_broadcast_matches_eager(name, other_shape):
    fn, make_a, make_b = BINARY[name]
    check_against_eager(fn, make_a(*SHAPE, seed=1), make_b(*other_shape, seed=2), kernels=1)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", ["mul", "div", "maximum", "pow", "lerp"])
def test_binary_math_matches_eager_in_half_precision(name, dtype):
    fn, make_a, make_b = BINARY[name]
    check_against_eager(fn, make_a(*SHAPE, dtype=dtype, seed=1), make_b(13, dtype=dtype, seed=2), kernels=1)


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, -1, -2, 0.5, -0.5, 3.5])
def test_pow_by_a_scalar_matches_eager(exponent):
    check_against_eager(lambda a: a ** exponent, positive(*SHAPE), kernels=1)


def test_pow_of_negative_bases_by_integral_exponents_matches_eager():
    check_against_eager(torch.pow, randn(*SHAPE, seed=1), randn(*SHAPE, scale=3.0, seed=2).round())


def test_scalar_base_pow_and_constant_copysign_match_eager():
    check_against_eager(lambda a: (torch.pow(2.0, a), torch.copysign(a, -0.0), torch.copysign(a, 0.0)),
                        randn(*SHAPE), kernels=1)


def test_mixed_dtypes_promote_as_eager():
    check_against_eager(lambda a, b, i: (a * b, a + i, b * i), randn(*SHAPE, dtype=BF16, seed=1),
                        randn(13, seed=2), ints(*SHAPE, seed=3), kernels=1)


def test_zero_dim_tensor_operand_matches_eager():
    check_against_eager(lambda a, s: a * s + s, randn(*SHAPE), torch.tensor(1.5), kernels=1)


def test_integer_arithmetic_matches_eager_exactly():
    def fn(a, b):
        return (a + b, a - b, a * b, a // b, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc"),
                a & b, a | b, a ^ b, ~a, a.abs(), torch.sign(a), a.clamp(-3, 4), a / b)
    check_against_eager(fn, ints(*SHAPE, seed=1), nonzero_ints(*SHAPE, seed=2))


def test_int32_and_uint8_arithmetic_matches_eager():
    check_against_eager(lambda a, b, u: (a * b + 3, (a > b).int(), u.float() / 255.0, u + 1),
                        ints(*SHAPE, dtype=torch.int32, seed=1), ints(13, dtype=torch.int32, seed=2),
                        ints(*SHAPE, lo=0, hi=250, dtype=torch.uint8, seed=3))


# -- comparisons, logic, selection -------------------------------------------------------------
def test_comparisons_match_eager():
    check_against_eager(lambda a, b: (a < b, a <= b, a > b, a >= b, a == b, a != b, a > 0.25),
                        randn(*SHAPE, seed=1), randn(13, seed=2).round(), kernels=1)


def test_logical_and_boolean_bitwise_ops_match_eager():
    def fn(a, b):
        p, q = a > 0, b > 0
        return (torch.logical_and(p, q), torch.logical_or(p, q), torch.logical_xor(p, q), torch.logical_not(p),
                p & q, p | q, p ^ q, ~p, torch.logical_not(a.round()))
    check_against_eager(fn, randn(*SHAPE, seed=1), randn(*SHAPE, seed=2), kernels=1)


def test_nan_and_inf_predicates_match_eager():
    x = torch.tensor([1.0, float("inf"), -float("inf"), float("nan"), -0.0, 3.0])
    check_against_eager(lambda a: (torch.isnan(a), torch.isinf(a), torch.isnan(a.log())), x, kernels=1)


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=str)
def test_where_and_masked_fill_match_eager(dtype):
    def fn(c, a, b):
        return torch.where(c > 0, a, b), torch.where(c > 0, a, 0.5), a.masked_fill(c < 0, -2.0)
    check_against_eager(fn, randn(*SHAPE, seed=1), randn(*SHAPE, dtype=dtype, seed=2),
                        randn(13, dtype=dtype, seed=3), kernels=1)


def test_where_on_integers_matches_eager():
    check_against_eager(lambda a, b: torch.where(a > 0, a, b), ints(*SHAPE, seed=1), ints(13, seed=2), kernels=1)


# -- casts --------------------------------------------------------------------------------------
CASTS = [(FP32, FP16), (FP32, BF16), (FP16, FP32), (BF16, FP32), (BF16, FP16), (FP32, torch.int32),
         (FP32, torch.bool), (torch.int64, FP32), (torch.int32, BF16), (torch.bool, FP32),
         (torch.uint8, FP32), (FP32, torch.float64), (torch.float64, FP32)]


@pytest.mark.parametrize("src,dst", CASTS, ids=[f"{str(a)[6:]}-{str(b)[6:]}" for a, b in CASTS])
def test_casts_match_eager(src, dst):
    if src == torch.bool:
        x = randn(*SHAPE) > 0
    elif src.is_floating_point:
        x = randn(*SHAPE, scale=10.0, dtype=src)
    else:
        x = ints(*SHAPE, lo=0 if src == torch.uint8 else -20, dtype=src)
    check_against_eager(lambda a: a.to(dst), x, kernels=1)


def test_casts_inside_a_kernel_round_where_the_program_casts():
    # (a * 3) rounded to bf16, then computed on: eager rounds there too
    check_against_eager(lambda a: (a * 3).to(BF16).float() * 1.001 + (a > 0).float(), randn(*SHAPE), kernels=1)


def test_float64_kernels_match_eager_to_float64_precision():
    check_against_eager(lambda a, b: (a.exp() * b).sum(1) + a.sin().mean(),
                        randn(*SHAPE, dtype=torch.float64, seed=1), randn(13, dtype=torch.float64, seed=2))


# -- clamp and activations ---------------------------------------------------------------------
CLAMPS = {
    "clamp": lambda a: a.clamp(-0.5, 0.7),
    "clamp_min": lambda a: a.clamp_min(0.1),
    "clamp_max": lambda a: a.clamp(max=0.1),
    "clamp_tensor": lambda a: torch.clamp(a, a.mean(0, keepdim=True) - 0.5, a.mean(0, keepdim=True) + 0.5),
}


@pytest.mark.parametrize("name", sorted(CLAMPS))
def test_clamp_matches_eager(name):
    check_against_eager(CLAMPS[name], randn(*SHAPE))


ACTIVATIONS = {
    "relu": F.relu, "relu6": lambda a: F.relu6(a * 4), "gelu": F.gelu,
    "gelu_tanh": lambda a: F.gelu(a, approximate="tanh"), "silu": F.silu, "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "hardtanh": lambda a: F.hardtanh(a * 2), "leaky_relu": lambda a: F.leaky_relu(a, 0.1),
    "softplus": lambda a: F.softplus(a * 10), "elu": F.elu, "hardsigmoid": lambda a: F.hardsigmoid(a * 4),
    "hardswish": lambda a: F.hardswish(a * 4), "mish": F.mish,
    "threshold": lambda a: F.threshold(a, 0.1, 20.0),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_matches_eager(name):
    check_against_eager(ACTIVATIONS[name], randn(*SHAPE), kernels=1)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu", "softplus"])
def test_activation_matches_eager_in_half_precision(name, dtype):
    check_against_eager(ACTIVATIONS[name], randn(*SHAPE, dtype=dtype), kernels=1)


# the backward formulas: threshold_backward, gelu/silu/sigmoid/tanh/hardtanh/elu/... backward
@pytest.mark.parametrize("name", sorted(set(ACTIVATIONS) - {"threshold"}))
def test_activation_backward_matches_eager(name):
    # mish's backward has no lowering rule (it stays ATen); every other one is a loop kernel
    reports = check_training(ACTIVATIONS[name], randn(*SHAPE).requires_grad_(), fwd_kernels=1,
                             bwd_kernels=None if name == "mish" else 1)
    assert len(reports) == 2


@pytest.mark.parametrize("name", ["gelu", "silu"])
def test_activation_backward_matches_eager_in_bf16(name):
    check_training(ACTIVATIONS[name], randn(*SHAPE, dtype=BF16).requires_grad_(), fwd_kernels=1, bwd_kernels=1)


# -- constants, fills, iota --------------------------------------------------------------------
def test_constant_outputs_are_generated_kernels():
    def fn(a):
        return (a + 1, torch.zeros(3, 4), torch.ones(3, dtype=torch.int64), torch.full((2, 5), True),
                torch.arange(5), torch.full_like(a, 2.5, dtype=BF16))
    check_against_eager(fn, randn(*SHAPE))


def test_iota_and_fills_fuse_into_their_consumer():
    check_against_eager(lambda a: a * torch.ones(13) + torch.arange(13) + torch.full_like(a, 2.0) - torch.arange(0, 1.3, 0.1)[:13],
                        randn(*SHAPE), kernels=1)


# -- views and data movement -------------------------------------------------------------------
VIEWS = {
    "transpose": (lambda a: torch.exp(a.t()) + 1, lambda: [randn(*SHAPE)]),
    "transposed_input": (lambda a: a * 2 + 1, lambda: [randn(13, 7).t()]),
    "sliced_input": (lambda a: a * 2 + 1, lambda: [randn(9, 20)[1:8, 2:15]]),
    "permute": (lambda a: a.permute(2, 0, 1) * 2, lambda: [randn(3, 5, 6)]),
    "permute_contiguous": (lambda a: a.permute(2, 0, 1).contiguous(), lambda: [randn(3, 5, 6)]),
    "expand": (lambda a: a.unsqueeze(0).expand(4, 7, 13) * 2, lambda: [randn(*SHAPE)]),
    "expanded_input": (lambda a: a + 1, lambda: [randn(7, 1).expand(7, 13)]),
    "view": (lambda a: a.view(3, 30).exp(), lambda: [randn(3, 5, 6)]),
    "view_unaligned": (lambda a: a.view(4, 6).exp() + a.view(2, 3, 4).view(3, 8).sum(1).view(3, 1).expand(3, 8).reshape(4, 6),
                       lambda: [randn(6, 4)]),
    "reshape_unaligned_of_transpose": (lambda a: a.t().reshape(4, 6) + 1, lambda: [randn(4, 6)]),
    "channels_last_input": (lambda a: (a.contiguous() + 1, a.sum(1), a * 2), lambda: [randn(2, 3, 4, 5).to(memory_format=torch.channels_last)]),
    "to_channels_last": (lambda a: a.to(memory_format=torch.channels_last) * 2, lambda: [randn(2, 3, 4, 5)]),
    "reshape_of_transpose": (lambda a: a.t().reshape(-1) * 2, lambda: [randn(*SHAPE)]),
    "flatten_of_permute": (lambda a: a.permute(1, 0, 2).flatten(1) + 1, lambda: [randn(3, 5, 6)]),
    "split_and_merge_dims": (lambda a: a.reshape(7, 13, 1).expand(7, 13, 2).reshape(7, 26) * 2, lambda: [randn(*SHAPE)]),
    "unsqueeze_squeeze": (lambda a: a.unsqueeze(1).squeeze(1) * 2 + a[None].squeeze(), lambda: [randn(*SHAPE)]),
    "slice": (lambda a: a[-4:, 1:-1] + 1, lambda: [randn(*SHAPE)]),
    "slice_step": (lambda a: a[1::3, ::4] * 2, lambda: [randn(*SHAPE)]),
    "slice_past_the_end": (lambda a: a[:, 5:100] * 2, lambda: [randn(*SHAPE)]),
    "select": (lambda a: a[2] + a[:, 3:4], lambda: [randn(*SHAPE)]),
    "select_negative": (lambda a: a[:, -1] * 2 + a[-1].sum(), lambda: [randn(*SHAPE)]),
    "diagonal": (lambda a: a.diagonal() * 2, lambda: [randn(5, 5)]),
    "unfold": (lambda a: a.unfold(1, 3, 2).sum(-1), lambda: [randn(*SHAPE)]),
    "cat": (lambda a, b: torch.cat([a, b * 2], 1), lambda: [randn(*SHAPE, seed=1), randn(7, 4, seed=2)]),
    "cat_dim0_three": (lambda a, b, c: torch.cat([a, b.exp(), c], 0) + 1,
                       lambda: [randn(1, 13, seed=1), randn(*SHAPE, seed=2), randn(3, 13, seed=3)]),
    "cat_of_transpose": (lambda a, b: torch.cat([a.t(), b], 0), lambda: [randn(*SHAPE, seed=1), randn(2, 7, seed=2)]),
    "stack": (lambda a, b: torch.stack([a, b], 1) + 1, lambda: [randn(*SHAPE, seed=1), randn(*SHAPE, seed=2)]),
    "stack_last": (lambda a, b: torch.stack([a, b], -1), lambda: [randn(*SHAPE, seed=1), randn(*SHAPE, seed=2)]),
    "split": (lambda a: [t * (i + 1) for i, t in enumerate(torch.split(a, 5, 1))], lambda: [randn(*SHAPE)]),
    "split_with_sizes": (lambda a: [t.exp() for t in torch.split(a, [3, 6, 4], 1)], lambda: [randn(*SHAPE)]),
    "chunk": (lambda a: a.chunk(3, 0)[1] * 2, lambda: [randn(9, 5)]),
    "unbind": (lambda a: sum(t * (i + 1) for i, t in enumerate(a.unbind(0))), lambda: [randn(3, 5, 6)]),
    "pad": (lambda a: F.pad(a, (1, 2, 3, 0), value=0.5), lambda: [randn(*SHAPE)]),
    "pad_negative": (lambda a: F.pad(a, (-1, 2)), lambda: [randn(*SHAPE)]),
    "pad_3d": (lambda a: F.pad(a, (1, 1, 0, 2, 1, 0)), lambda: [randn(2, 3, 4)]),
    "broadcast_3d": (lambda a, b, c: a * b + c, lambda: [randn(3, 1, 6, seed=1), randn(5, 1, seed=2), randn(6, seed=3)]),
    "returns_a_view": (lambda a: ((a * 2).t(), a.t(), a + 1), lambda: [randn(*SHAPE)]),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views_and_data_movement_match_eager(name):
    fn, make = VIEWS[name]
    check_against_eager(fn, *make())


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_views_and_cat_match_eager_in_half_precision(dtype):
    check_against_eager(lambda a, b: (torch.cat([a.t(), b.expand(2, 7)], 0) * 2, F.pad(a, (1, 1)), a[:, ::2] + 1),
                        randn(*SHAPE, dtype=dtype, seed=1), randn(7, dtype=dtype, seed=2))


VIEW_GRADS = {  # backward formulas of views: slice_backward, select_backward, sums over expands, pads
    "slice_select_expand": lambda a: (a.t()[2:9:3] * 2).sum() + a[:, -1].exp().sum() + a.unsqueeze(0).expand(3, 7, 13).mean(),
    "cat_pad": lambda a: F.pad(torch.cat([a, a[:, :3] * 2], 1), (1, 2)).exp(),
    "stack_split": lambda a: torch.stack(torch.split(a, 4, 1)[:3], 0).sin(),
    "permute_reshape": lambda a: a.reshape(7, 13, 1).permute(1, 0, 2).reshape(13, 7).tanh(),
    "where_clamp": lambda a: torch.where(a > 0, a * 2, a.exp()).clamp(-0.5, 1.5),
}


@pytest.mark.parametrize("name", sorted(VIEW_GRADS))
def test_view_and_data_movement_backward_match_eager(name):
    check_training(VIEW_GRADS[name], randn(*SHAPE).requires_grad_(), bwd_kernels=1)


def test_in_place_updates_of_inputs_match_eager():
    a, b = randn(*SHAPE, seed=1), randn(*SHAPE, seed=1)
    out, _ = run_triton(lambda x: x.mul_(2).add_(1), a)
    expected = b.mul_(2).add_(1)
    assert rel_error(a, expected) <= REL_TOL[FP32]
    assert rel_error(out, expected) <= REL_TOL[FP32]


# -- gathers ------------------------------------------------------------------------------------
GATHERS = {
    "embedding": (lambda w, i: F.embedding(i, w) * 2, lambda: [randn(10, 6), ints(3, 4, lo=0, hi=10)]),
    "embedding_sum": (lambda w, i: F.embedding(i, w).sum(-1), lambda: [randn(10, 6), ints(2, 3, lo=0, hi=10)]),
    "index_negative": (lambda a, i: a[i] + 1, lambda: [randn(*SHAPE), torch.tensor([-1, 0, -7, 3])]),
    "index_two_dims": (lambda a, i, j: a[i, j] * 2, lambda: [randn(*SHAPE), ints(5, lo=0, hi=7), ints(5, lo=0, hi=13)]),
    "index_broadcast": (lambda a, i, j: a[i, j], lambda: [randn(*SHAPE), ints(3, 1, lo=0, hi=7), ints(4, lo=0, hi=13)]),
    "index_inner_dim": (lambda a, i: a[:, i] * 2, lambda: [randn(*SHAPE), ints(4, lo=0, hi=13)]),
    "index_by_matrix": (lambda a, i: a[i] * 2, lambda: [randn(*SHAPE), ints(2, 3, lo=0, hi=7)]),
    "gather": (lambda a, i: torch.gather(a, 1, i) * 2, lambda: [randn(*SHAPE), ints(7, 5, lo=0, hi=13)]),
    "gather_dim0": (lambda a, i: torch.gather(a, 0, i), lambda: [randn(*SHAPE), ints(4, 13, lo=0, hi=7)]),
    "gather_of_computed": (lambda a, i: torch.gather(a * 2, 1, i), lambda: [randn(*SHAPE), ints(7, 5, lo=0, hi=13)]),
    "index_select": (lambda a, i: torch.index_select(a, 0, i) + 1, lambda: [randn(*SHAPE), ints(4, lo=0, hi=7)]),
    "index_select_dim1": (lambda a, i: torch.index_select(a, 1, i), lambda: [randn(*SHAPE), ints(5, lo=0, hi=13)]),
    "one_hot": (lambda i: F.one_hot(i, 5).float() * 2, lambda: [ints(7, lo=0, hi=5)]),
}


@pytest.mark.parametrize("name", sorted(GATHERS))
def test_gathers_match_eager(name):
    fn, make = GATHERS[name]
    check_against_eager(fn, *make())


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_embedding_matches_eager_in_half_precision(dtype):
    check_against_eager(lambda w, i: F.embedding(i, w) * 3, randn(10, 6, dtype=dtype), ints(3, 4, lo=0, hi=10), kernels=1)


# -- reductions ---------------------------------------------------------------------------------
REDUCTIONS = {
    "sum": lambda a, d: a.sum(d), "mean": lambda a, d: a.mean(d), "prod": lambda a, d: a.prod(d),
    "amax": lambda a, d: a.amax(d), "amin": lambda a, d: a.amin(d), "argmax": lambda a, d: a.argmax(d),
    "argmin": lambda a, d: a.argmin(d), "max_dim": lambda a, d: a.max(d), "min_dim": lambda a, d: a.min(d),
    "var": lambda a, d: a.var(d), "var_biased": lambda a, d: a.var(d, correction=0),
    "std": lambda a, d: a.std(d), "var_mean": lambda a, d: torch.var_mean(a, d),
    "any": lambda a, d: (a > 1).any(d), "all": lambda a, d: (a > -1.5).all(d),
    "norm2": lambda a, d: torch.linalg.vector_norm(a, dim=d), "norm1": lambda a, d: a.norm(1, dim=d),
    "norm_inf": lambda a, d: torch.linalg.vector_norm(a, float("inf"), dim=d),
    "norm3": lambda a, d: torch.linalg.vector_norm(a, 3, dim=d),
    "logsumexp": lambda a, d: torch.logsumexp(a, d),
}


@pytest.mark.parametrize("dim", [1, 0], ids=["last", "first"])
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_matches_eager(name, dim):
    x = randn(*SHAPE) if name != "prod" else positive(*SHAPE) * 0.9
    check_against_eager(lambda a: REDUCTIONS[name](a, dim), x)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "argmax", "var", "var_mean", "norm2"])
def test_reduction_matches_eager_in_half_precision(name, dtype):
    check_against_eager(lambda a: REDUCTIONS[name](a, 1), randn(*SHAPE, dtype=dtype))


EVERYTHING = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "argmax": torch.argmax, "var": torch.var,
              "prod": torch.prod, "norm": torch.linalg.vector_norm, "any": lambda a: (a > 2).any()}


@pytest.mark.parametrize("name", sorted(EVERYTHING))
def test_reduction_over_everything_matches_eager(name):
    check_against_eager(EVERYTHING[name], positive(4, 3) if name == "prod" else randn(*SHAPE), kernels=1)


def test_reductions_over_several_dims_with_keepdim_match_eager():
    check_against_eager(lambda a: (a.sum((0, 2), keepdim=True), a.mean((0, 2)), a.amax((1, 2)),
                                   torch.var_mean(a, (0, 1), keepdim=True)), randn(3, 5, 6))


def test_reductions_of_non_contiguous_and_broadcast_inputs_match_eager():
    check_against_eager(lambda a, b, c: (a.t().sum(1), (b * c).sum(-1), a.t().softmax(-1)),
                        randn(*SHAPE, seed=1), randn(3, 1, 6, seed=2), randn(5, 6, seed=3))


def test_reduction_of_an_expanded_input_matches_eager():
    check_against_eager(lambda a: a.expand(4, 7, 13).sum(0) + a.unsqueeze(0).expand(3, 7, 13).amax(0), randn(*SHAPE))


def test_integer_and_boolean_reductions_match_eager_exactly():
    def fn(a, x):
        return a.sum(1), a.amax(0), a.argmax(1), a.amin(1), (x > 0).sum(1), (x > 0).sum(), (a > 0).any(1), a.prod(1)
    check_against_eager(fn, ints(7, 9, lo=-5, hi=5), randn(*SHAPE))


def test_int32_sums_widen_to_int64_like_eager():
    check_against_eager(lambda a: (a.sum(1), a.prod(0), a.amax(1)), ints(*SHAPE, lo=-3, hi=4, dtype=torch.int32))


def test_variance_of_too_few_elements_is_nan_like_eager():
    check_against_eager(lambda a: (a.var(1), a.std(1, correction=0), a.var(1, correction=2)), randn(5, 1))


def test_sum_with_a_dtype_accumulates_in_it():
    check_against_eager(lambda a: (a.sum(1, dtype=FP32), a.sum(1)), randn(*SHAPE, dtype=FP16))


def test_reductions_propagate_nan_as_eager():
    x = randn(*SHAPE)
    x[2, 3] = x[5, 0] = x[5, 7] = float("nan")
    check_against_eager(lambda a: (a.amax(1), a.amin(0), a.argmax(1), a.argmin(0), a.max(1), a.sum(1),
                                   torch.maximum(a, a.t().contiguous().t() * 0.5), F.relu(a), a.clamp(-0.5, 0.5)), x)


def test_overflow_to_inf_matches_eager():
    check_against_eager(lambda a: ((a * 100).exp(), (a * 1e4).to(FP16), a.log()), randn(*SHAPE))


def test_cumsum_and_its_consumer_are_one_generated_kernel():
    # a scan is a row op of the IR (scans, issue 21): no ATen call is left for it
    out, reports = run_triton(lambda a: a.cumsum(1).exp(), randn(*SHAPE))
    assert reports[0].loop_kernels == 1 and reports[0].extern_ops == 0
    assert rel_error(out, randn(*SHAPE).double().cumsum(1).exp()) <= REL_TOL[FP32]


# -- softmax and the norms ----------------------------------------------------------------------
# name -> (fn(x, *params), number of (13,)-shaped parameters it takes)
NORMS = {
    "softmax": (lambda a: a.softmax(-1), 0),
    "log_softmax": (lambda a: a.log_softmax(-1), 0),
    "masked_softmax": (lambda a: a.masked_fill(a > 1.0, float("-inf")).softmax(-1), 0),
    "layer_norm": (lambda a, w, b: F.layer_norm(a, (13,), w, b), 2),
    "layer_norm_no_affine": (lambda a: F.layer_norm(a, (13,)), 0),
    "rms_norm": (lambda a, w: F.rms_norm(a, (13,), w, eps=1e-6), 1),
    "rms_norm_no_weight": (lambda a: F.rms_norm(a, (13,)), 0),
}


@pytest.mark.parametrize("dtype,layout", [(FP32, "contiguous"), (FP32, "transposed"), (FP16, "contiguous"),
                                          (BF16, "transposed")], ids=["fp32", "fp32-transposed", "fp16", "bf16-transposed"])
@pytest.mark.parametrize("name", sorted(NORMS))
def test_softmax_and_norms_are_one_kernel_matching_eager(name, dtype, layout):
    x = randn(*SHAPE, dtype=dtype, seed=1) if layout == "contiguous" else randn(13, 7, dtype=dtype, seed=1).t()
    fn, n = NORMS[name]
    check_against_eager(fn, x, *[randn(13, dtype=dtype, seed=2 + k) for k in range(n)], kernels=1)


@pytest.mark.parametrize("name", sorted(NORMS))
def test_softmax_and_norms_backward_match_eager(name):
    fn, n = NORMS[name]
    check_training(fn, randn(*SHAPE, seed=1).requires_grad_(),
                   *[randn(13, seed=2 + k).requires_grad_() for k in range(n)], fwd_kernels=1)


def test_losses_and_their_backward_match_eager():
    check_training(lambda a, t, b: F.cross_entropy(a, t) + F.mse_loss(a, b), randn(*SHAPE, seed=1).requires_grad_(),
                   ints(7, lo=0, hi=13), randn(*SHAPE, seed=2).requires_grad_())


# -- empty and odd shapes, dynamic sizes --------------------------------------------------------
EMPTY = {
    "pointwise_no_rows": (lambda a: a.exp() + 1, (0, 5)),
    "pointwise_no_columns": (lambda a: a * 2, (5, 0)),
    "sum_of_no_rows": (lambda a: a.sum(1), (0, 5)),
    "sum_over_nothing": (lambda a: a.sum(1), (5, 0)),
    "amax_of_no_rows": (lambda a: a.amax(1), (0, 5)),
    "softmax_of_no_rows": (lambda a: a.softmax(-1), (0, 5)),
}


@pytest.mark.parametrize("name", sorted(EMPTY))
def test_zero_size_tensors_match_eager(name):
    fn, shape = EMPTY[name]
    check_against_eager(fn, randn(*shape))


@pytest.mark.parametrize("shape", [(1,), (1, 1), (3, 1), (1, 17), (2, 3, 5, 7), (129,)], ids=str)
def test_odd_shapes_match_eager(shape):
    check_against_eager(lambda a: (a.exp() * 2, a.sum(-1), a.softmax(-1)), randn(*shape))


def test_scalar_results_match_eager():
    check_against_eager(lambda a: (a.sum() * 2 + 1, a.mean(), a.amax()), randn(*SHAPE))


def test_dynamic_sizes_run_one_compiled_graph_for_every_size():
    def fn(a, b):
        return ((a + b).softmax(-1), F.layer_norm(a, (13,)) * b, torch.cat([a, a * 2], 0) + b, (a * b).sum(0),
                a[1:, 1:] * b[1:], a.t().contiguous())  # a slice's dynamic stride is max(1, size - 1)
    with tilewright.config.patch(**FAST), collect_reports() as reports:
        compiled = torch.compile(fn, backend="tilewright", dynamic=True)
        for rows in (5, 9, 3):
            a, b = randn(rows, 13, seed=rows), randn(13, seed=1)
            for o, r in zip(compiled(a, b), fn(a.double(), b.double())):
                assert rel_error(o, r.float()) <= REL_TOL[FP32]
    assert_on_triton(reports)
    assert len(reports) == 1 and reports[0].loop_kernels >= 1
