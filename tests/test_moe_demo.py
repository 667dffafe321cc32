"""The Qwen3-MoE demo case and the three bugs it found: a cat's branch mask pushed into a fused
reduction (Qwen3's q/k RMSNorm feeding rotary's ``rotate_half``: 5e-2 from eager in bf16, 0.6
in fp32 on the bare pattern), Triton's truncating ``//``/``%`` on the negative numerators sympy
makes (an out-of-bounds store that corrupted the interpreter's heap), and an FX node named
``grouped_mm_*`` taken for a fusion group by the scheduler."""

from __future__ import annotations

import sympy
import torch

import tilewright
from tilewright.ir.index import code


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _rotate_half_of_rms_norm(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Qwen3's k path: an RMSNorm over the head dim, then rotary's rotate_half (a cat of the
    two halves, so each half reads the normalised row at a shifted lane)."""
    x = y.float()
    x = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(y.dtype) * w
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def test_a_cat_of_a_reduction_row_keeps_the_whole_row_in_the_sum():
    g = torch.Generator().manual_seed(0)
    y, w = torch.randn(3, 7, 2, 16, generator=g), torch.randn(16, generator=g)  # ragged rows
    ref = _rotate_half_of_rms_norm(y.double(), w.double())
    for mode in ("auto", "triton"):
        torch._dynamo.reset()
        with tilewright.config.patch(force_backend=mode, strict=True):
            out = torch.compile(_rotate_half_of_rms_norm, backend="tilewright")(y, w)
        assert _rel(out, ref) < 1e-5, mode  # was 0.65: each half summed half of the row


class _CInt(int):
    """An int whose ``//`` and ``%`` truncate toward zero, as Triton's and C's do."""

    def _wrap(self, v):
        return _CInt(v)

    def __floordiv__(self, o):
        q = abs(int(self)) // abs(int(o))
        return _CInt(q if (self >= 0) == (o >= 0) else -q)

    def __mod__(self, o):
        return _CInt(int(self) - int(o) * int(self.__floordiv__(o)))

    def __add__(self, o):
        return _CInt(int(self) + int(o))

    __radd__ = __add__

    def __sub__(self, o):
        return _CInt(int(self) - int(o))

    def __rsub__(self, o):
        return _CInt(int(o) - int(self))

    def __mul__(self, o):
        return _CInt(int(self) * int(o))

    __rmul__ = __mul__

    def __neg__(self):
        return _CInt(-int(self))


def test_index_code_floors_negative_numerators_under_truncating_division():
    x0, r0 = sympy.symbols("x0 r0", integer=True, nonnegative=True)
    # sympy pulls x0 out: x0 + floor((r0 - 5152)/64), a negative numerator for small r0
    exprs = [sympy.floor((r0 + 64 * x0 - 5152) / 64), sympy.Mod(r0 - 37, 64), sympy.floor((r0 + 3) / 5)]
    for e in exprs:
        text = code(e)
        for xv in (80, 81, 97):
            for rv in (0, 5, 31, 32, 40, 63):
                want = int(e.subs({x0: xv, r0: rv}))
                assert eval(text, {"x0": xv, "r0": rv}) == want, (text, xv, rv)  # Python floor
                assert eval(text, {"x0": _CInt(xv), "r0": _CInt(rv)}) == want, (text, xv, rv)  # C
    assert "%" not in code(sympy.floor((r0 + 3) / 5))  # non-negative: the plain form


@torch.library.custom_op("tilewright_test::group_scale", mutates_args=())
def group_scale(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@group_scale.register_fake
def _(x):
    return torch.empty_like(x)


def test_an_extern_node_named_group_is_not_a_fusion_group():
    def f(x):
        y = x * 2 + 1  # a loop kernel read by the extern op (FX names it group_scale)...
        z = torch.ops.tilewright_test.group_scale(y)
        return (z + y).sum(-1)  # ...and fused with what reads both
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    out = torch.compile(f, backend="tilewright")(x)
    assert _rel(out, f(x.double())) < 1e-6


def test_qwen3_moe_inference_runs_its_experts_through_the_grouped_op():
    """The demo's model, forward only (the demo case adds the backward and the Triton mode):
    both grouped GEMMs of both layers go through ``tilewright.grouped_mm``, and the logits are
    as close to a float64 copy of the model as eager bf16's are (measured: both 9.6e-3; before
    the cat-mask fix the backend was 5e-2 from eager on the smaller model of
    test_grouped_gemm.py)."""
    from tilewright.demo import models
    from tilewright.demo.run import counting_grouped

    model = models.build_qwen3_moe(torch.bfloat16).eval()
    ids = models.qwen3_moe_inputs()
    with torch.no_grad():
        exact = models.qwen3_moe_float64(model)(input_ids=ids).logits
        ref = model(input_ids=ids).logits
        torch._dynamo.reset()
        with counting_grouped() as calls:
            out = torch.compile(model, backend="tilewright")(input_ids=ids).logits
    assert sum(calls.values()) == 4 and {p.case for p, _ in calls} == {"2d3d"}
    assert {p.G for p, _ in calls} == {8}
    assert torch.isfinite(out).all()
    noise = _rel(ref, exact)
    assert 1e-3 < noise < 2e-2  # bf16 rounding, not an exact match by construction
    assert _rel(out, exact) < 1.3 * noise
    assert _rel(out, ref) < 2e-2
