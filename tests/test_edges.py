"""Regression tests for the edges of issue 27 (each named after what it guards): NaN through
libm compositions, round half to even, round(decimals=...) and angle lowered, in each emitter
that runs here (the Triton interpreter, C++; SYCL and Metal in ``test_special_values.py``)."""

from __future__ import annotations

import pytest
import torch

import tilewright
from tilewright.compiler.report import collect_reports

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
FAST = dict(strict=True, bench_rep=1, bench_min_rep=1, bench_warmup=0, bench_budget_ms=0.0)


def _emitters() -> list:
    from tilewright.runtime import cpp

    return ["triton", pytest.param("cpp", marks=pytest.mark.skipif(not cpp.available(), reason="no C++ compiler"))]


def compiled_on(mode: str, fn, *args, kernels: int = 1):
    """``fn(*args)`` compiled with ``mode`` forced; asserts that ``kernels`` generated loop
    kernels ran, each in ``mode``'s language, and nothing fell back to ATen."""
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend=mode, **FAST), collect_reports() as reports:
        out = torch.compile(fn, backend="tilewright", dynamic=False)(*args)
    assert reports and all(r.fallback is None for r in reports)
    assert sum(r.loop_kernels for r in reports) == kernels, [k.op for r in reports for k in r.kernels]
    for r in reports:
        assert all(k.winner.startswith(f"{mode}.") for k in r.kernels), [(k.op, k.winner, k.reason) for k in r.kernels]
        assert r.extern_ops == 0, f"{r.extern_ops} ATen ops left in the graph"
    return out


def same_values(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit as values: NaN where NaN, the same infinities, zeros of the same sign."""
    nan = want.isnan()
    return (got.dtype == want.dtype and got.shape == want.shape and torch.equal(got.isnan(), nan)
            and torch.equal(got.nan_to_num(), want.nan_to_num())
            and torch.equal(got.signbit() & ~nan, want.signbit() & ~nan))


def _specials(n: int = 64) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 3
    x[:8] = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-42, -1e-42])
    return x


@pytest.mark.parametrize("mode", _emitters())
def test_sin_of_atan_keeps_nan(mode):
    # g++ rewrites sinf(atanf(x)) as x / sqrt(x*x + 1), else copysign(1, x), unless the libm
    # calls are no builtins: +-1 for a NaN input
    x = _specials()
    fn = lambda x: torch.sin(torch.atan(x))  # noqa: E731
    got = compiled_on(mode, fn, x)
    want = fn(x)
    assert torch.equal(got.isnan(), want.isnan()), (got[:8], want[:8])
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("mode", _emitters())
def test_round_is_half_to_even_where_x_plus_half_rounds(mode):
    x = torch.tensor([8388609.0, -8388609.0, 8388607.5, 0.5, 1.5, 2.5, -0.5, -2.5, -0.3, 16777215.0,
                      float("inf"), -float("inf"), float("nan"), 4194303.5, 0.49999997])
    got = compiled_on(mode, lambda x: torch.round(x) * 1, x)
    assert same_values(got, torch.round(x)), (got, torch.round(x))


@pytest.mark.parametrize("mode", _emitters())
@pytest.mark.parametrize("decimals", [2, 0, -1])
def test_round_with_decimals_is_lowered(mode, decimals):
    x = torch.randn(7, 13, generator=torch.Generator().manual_seed(decimals + 5)) * 300
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 1.125])
    fn = lambda x: torch.round(x, decimals=decimals) + 1  # noqa: E731
    for dt in (torch.float32, torch.bfloat16):
        got = compiled_on(mode, fn, x.to(dt))
        assert same_values(got, fn(x.to(dt))), dt


@pytest.mark.parametrize("mode", _emitters())
def test_angle_is_lowered(mode):
    x = _specials()
    fn = lambda x: torch.angle(x) * 2  # noqa: E731
    got = compiled_on(mode, fn, x)
    assert same_values(got, fn(x))
    i = torch.randint(-5, 5, (7, 13), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    got = compiled_on(mode, torch.angle, i)
    assert same_values(got, torch.angle(i))
