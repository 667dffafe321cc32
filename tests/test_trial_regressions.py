"""Regression tests for what a new-user trial of the loop-kernel path found: one test per bug,
each named after what it guards."""

from __future__ import annotations

import random
import warnings

import pytest
import sympy
import torch

import tilewright
from loop_check import check_against_eager
from tilewright.ir.index import simplify, var


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _compile(fn, mode, **kw):
    """``fn`` compiled with ``mode`` forced in strict mode. The patch is held over each call:
    Dynamo compiles at the first call, not at torch.compile (a patch around torch.compile alone
    was over before anything compiled, so these tests ran with the default settings)."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tilewright", **kw)

    def call(*args, **kwargs):
        with tilewright.config.patch(force_backend=mode, strict=True):
            return compiled(*args, **kwargs)
    return call


def test_simplify_bounds_a_remainder_by_its_divisor_not_by_its_value_at_the_top():
    # floor((8*floor(f/8) + Mod(f, 8)) / 4) keeps the Mod term: Mod(3*x0 + x1, 8) at the
    # largest x0, x1 happens to be small, but it reaches 7 in between
    x0, x1 = var("x", 0), var("x", 1)
    f = 3 * x0 + x1
    e = sympy.floor((8 * sympy.floor(f / 8) + sympy.Mod(f, 8)) / 4)
    got = simplify(e, {x0: 8, x1: 6})
    for a in range(8):
        for b in range(6):
            assert int(got.subs({x0: a, x1: b})) == (3 * a + b) // 4


@pytest.mark.parametrize("mode", ["auto", "triton"])
def test_two_reshapes_feeding_cat_and_pad_keep_every_index_term(mode):
    x = torch.randn(2, 3, 4, generator=_gen(0))
    for fn in (lambda x: torch.cat([x.reshape(3, 8).reshape(8, 3)] * 2, 1) + 1,
               lambda x: torch.nn.functional.pad(x.reshape(3, 8).reshape(8, 3), (1, 2), value=0.5) + 1):
        out = _compile(fn, mode)(x)
        assert torch.equal(out, fn(x))


def test_random_reshape_chains_into_cat_pad_and_slices_match_eager():
    rng = random.Random(0)
    shapes = {(2, 3, 4): [(3, 8), (8, 3), (4, 6), (2, 12), (6, 2, 2), (12, 2)],
              (4, 6): [(3, 8), (8, 3), (2, 12), (4, 3, 2), (24, 1)]}
    for case in range(12):
        src = rng.choice(list(shapes))
        r1, r2 = rng.choice(shapes[src]), rng.choice(shapes[src])
        d = rng.randrange(len(r2))
        kind = rng.choice(["cat", "pad"])

        def fn(x, r1=r1, r2=r2, d=d, kind=kind):
            y = x.reshape(r1).reshape(r2)
            if kind == "cat":
                return torch.cat([y, y * 2], d) + 1
            pad = [0] * (2 * len(r2))
            pad[2 * (len(r2) - 1 - d)], pad[2 * (len(r2) - 1 - d) + 1] = 1, 2
            return torch.nn.functional.pad(y, pad, value=0.5) + 1

        x = torch.randn(*src, generator=_gen(case))
        assert torch.equal(_compile(fn, "auto")(x), fn(x)), (src, r1, r2, kind, d)


def test_bool_add_is_a_logical_or_in_generated_kernels():
    # the (6,) operand's tuning input drew all-negative values: a wrapping int1 add passed
    # the candidate check there and was wrong on real data
    a = torch.randn(5, 6, generator=_gen(1))
    b = torch.tensor([1.0, -1.0, 2.0, 0.5, -3.0, 1.0])
    check_against_eager(lambda a, b: ((a > 0) + (b > 0)) * ((a > 0) * (b > 0) + (a < 0)), a, b)


def test_float_floor_division_matches_eager_where_the_quotient_rounds_up():
    a = torch.tensor([1.0, 3.0, 0.3, -1.0, 7.0, 1.0, -1.0, float("inf"), 0.0, -0.0])
    b = torch.tensor([0.1, 0.3, 0.1, 0.1, 0.7, float("inf"), float("inf"), 2.0, -3.0, 2.0])
    for fn in (lambda a, b: a // b, lambda a, b: torch.div(a, b, rounding_mode="floor")):
        out = _compile(fn, "triton")(a, b)
        ref = fn(a, b)
        assert torch.equal(torch.isnan(out), torch.isnan(ref))
        assert torch.equal(out[~torch.isnan(ref)], ref[~torch.isnan(ref)])
        assert torch.equal(torch.signbit(out), torch.signbit(ref))


@pytest.mark.parametrize("mode", ["auto", "triton"])
def test_reductions_of_0d_tensors_compile_without_falling_back(mode):
    s = torch.tensor(3.0)
    for fn in (lambda s: (s * 2).sum(), lambda s: (s * 2).amax(), lambda s: (s * 2).argmax()):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a fallback warns
            out = _compile(fn, mode)(s)
        assert torch.equal(out, fn(s))


def test_a_symbolic_size_read_by_aten_and_by_a_loop_kernel_stays_alive():
    fn = lambda x: x / x.shape[0] + x.shape[1]  # noqa: E731
    cf = _compile(fn, "auto", dynamic=True)
    for shape in [(3, 5), (4, 1), (6, 2)]:
        x = torch.randn(*shape, generator=_gen(2))
        torch.testing.assert_close(cf(x), fn(x))


def test_views_of_empty_tensors_compile():
    for fn, shape in ((lambda x: x.transpose(0, 1).reshape(-1) * 2, (0, 5)),
                      (lambda x: (x * 2).flatten(), (3, 0, 2))):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            out = _compile(fn, "auto")(torch.randn(*shape))
        assert out.shape == fn(torch.randn(*shape)).shape


@pytest.mark.parametrize("mode", ["auto", "triton"])
def test_strided_input_whose_stride_is_its_own_size_symbol_compiles(mode):
    # recompiled with dynamic sizes, a slice's row stride is a symbol no shape holds: the
    # scheduler found no trace-time value for it and the whole graph fell back to ATen
    def fn(x):
        return x.sum(-1, keepdim=True) + 1

    torch._dynamo.reset()
    with tilewright.config.patch(force_backend=mode, strict=True, graph_race="off"):
        compiled = torch.compile(fn, backend="tilewright")
        for n in (8, 10, 13):
            x = torch.randn(6, 2 * n, generator=_gen(n))[:, ::2]
            torch.testing.assert_close(compiled(x), fn(x))



def test_negative_graph_race_rounds_is_refused_not_silently_a_race_off():
    # TILEWRIGHT_GRAPH_RACE_ROUNDS=-2 was taken and quietly meant "no race"
    from tilewright._config import Config
    from tilewright.errors import ConfigError

    with pytest.raises(ConfigError, match="graph_race_rounds=-2.*TILEWRIGHT_GRAPH_RACE_ROUNDS"):
        Config.from_env({"TILEWRIGHT_GRAPH_RACE_ROUNDS": "-2"})
    assert Config.from_env({"TILEWRIGHT_GRAPH_RACE_ROUNDS": "0"}).graph_race_rounds == 0   # 0: no race


@pytest.mark.parametrize("mode", ["aten", "cpp"])
def test_tuning_inputs_keep_an_offset_index_inside_the_dim_it_indexes(mode):
    # index_put((i, i + 2)): i indexes dim 0 (10) and i + 2 dim 1 (8). The tuner drew i below
    # min(10, 8) = 8 ignoring the + 2, so every candidate raised IndexError on its own inputs
    # (strict: the graph failed to compile; otherwise the kernel was lost to ATen)
    def fn(w, x, i):
        return (w * 1).index_put((i, i + 2), x[:, 0] * 5, accumulate=True).sin()

    w = torch.randn(10, 8, generator=_gen(0), requires_grad=True)
    x = torch.randn(12, 8, generator=_gen(1))
    i = torch.randint(0, 3, (12,), generator=_gen(2))
    wr = w.detach().double().requires_grad_()
    ref = fn(wr, x.double(), i)
    ref.pow(2).sum().backward()
    torch._dynamo.reset()
    # the patch holds over the call: compiling happens there, not at torch.compile
    with tilewright.config.patch(force_backend=mode, strict=True, graph_race="off"):
        out = torch.compile(fn, backend="tilewright")(w, x, i)
        out.pow(2).sum().backward()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5
    assert ((w.grad.double() - wr.grad).norm() / wr.grad.norm()).item() < 1e-5


@pytest.mark.parametrize("mode", ["auto", "cpp"])
def test_tuning_inputs_keep_an_offset_gather_index_inside_its_dim(mode):
    # w[i + 2] with i < 8 valid for w's 10 rows: the tuner drew i below 10, so every candidate
    # (ATen's too) raised IndexError; strict failed to compile, auto lost the kernel to ATen
    def fn(w, i):
        return (w[i + 2] * 2).sin()

    w = torch.randn(10, 8, generator=_gen(0))
    i = torch.randint(0, 8, (12,), generator=_gen(1))
    assert torch.allclose(_compile(fn, mode)(w, i), fn(w, i), rtol=1e-5, atol=1e-6)


def test_tuning_inputs_keep_a_strided_gather_index_inside_its_dim():
    # w[2 * i + 1]: the bound solves the affine form (i below (10 - 1 - 1) // 2 + 1 = 5)
    def fn(w, i):
        return (w[2 * i + 1] * 2).sin()

    w = torch.randn(10, 8, generator=_gen(2))
    i = torch.randint(0, 5, (12,), generator=_gen(3))
    assert torch.allclose(_compile(fn, "auto")(w, i), fn(w, i), rtol=1e-5, atol=1e-6)
