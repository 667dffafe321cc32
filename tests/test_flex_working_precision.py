"""A bf16/fp16 FlexAttention's score_mod runs in fp32, as FlexAttention's math reference and
Inductor compute it (kinds/attention/lower_flex.py ``_in_working_precision``): the traced ops
carry q's dtype, and rounding after each of them put a soft-cap 30x further from float64 than
eager."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

import tilewright
from tilewright.ir import expr as E
from tilewright.kinds.attention import mods


def _soft_cap(s, b, h, m, n):
    return 50 * torch.tanh(s / 50)


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_soft_capped_low_precision_flex_is_as_close_to_float64_as_eager(dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=g) for _ in range(3))
    q, k, v = (q * 10).to(dtype), (k * 10).to(dtype), v.to(dtype)
    ref = flex_attention(q.double(), k.double(), v.double(), score_mod=_soft_cap)
    torch._dynamo.reset()
    with tilewright.config.patch(graph_race="off", strict=True):
        out = torch.compile(flex_attention, backend="tilewright")(q, k, v, score_mod=_soft_cap)
    eager = flex_attention(q, k, v, score_mod=_soft_cap)
    assert _rel(out, ref) < 2 * _rel(eager, ref) + 1e-3, (_rel(out, ref), _rel(eager, ref))


def test_the_implicit_roundings_of_the_score_path_are_dropped():
    from tilewright.kinds.attention.lower_flex import _in_working_precision

    # what the loop rules make of bf16 ``50 * tanh(s / 50)`` plus a bf16 capture's value
    s = E.cast(mods.score(), "bf16")
    step = E.cast(E.op("truediv", E.cast(s, "fp32"), E.const(50.0, "fp32")), "bf16")
    capped = E.cast(E.op("tanh", E.cast(step, "fp32")), "bf16")
    bias = E.cast(E.load("c0", (), "bf16"), "fp32")
    value = E.op("add", E.cast(capped, "fp32"), bias)
    out = _in_working_precision(value)
    assert not any(n.op == "cast" and n.dtype == "bf16" and not n.arg for n in E.toposort([out]))
    assert any(n.op == "load" and n.dtype == "bf16" for n in E.toposort([out]))  # the capture's own dtype
    explicit = _in_working_precision(E.cast(mods.score(), "bf16", explicit=True))
    assert explicit.op == "cast" and explicit.dtype == "bf16" and explicit.arg


def test_an_explicit_cast_in_the_score_mod_still_rounds():
    def rounded(s, b, h, m, n):
        return (s * 1.0001).to(torch.bfloat16).to(torch.float32) * 2

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g) for _ in range(3))
    torch._dynamo.reset()
    with tilewright.config.patch(graph_race="off", strict=True):
        out = torch.compile(flex_attention, backend="tilewright")(q, k, v, score_mod=rounded)
    ref = flex_attention(q, k, v, score_mod=rounded)  # fp32 eager rounds the score to bf16 too
    assert _rel(out, ref.double()) < 1e-5
