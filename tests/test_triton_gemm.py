"""Numerics of the Triton GEMM template in the interpreter, against float64 references computed
here (not through tilewright), with outputs poisoned by NaN before every run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import TOL, rel_err
from hypothesis import given, settings
from hypothesis import strategies as st

from tilewright.problem import DTYPE_NAMES, EpilogueInput, EpilogueOp, GemmProblem
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

TEMPLATE = get_template("triton.gemm")
CPU = get_target("cpu")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def params(bm=32, bn=32, bk=32, group_m=4):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m, "num_warps": 4,
            "num_stages": 2}


def layout_of(t: torch.Tensor) -> str:
    if t.stride(-1) == 1:
        return "row"
    if t.stride(-2) == 1:
        return "col"
    return "strided"


def matrix(rows, cols, layout, dtype, batch=None):
    lead = (batch,) if batch else ()
    if layout == "col":
        return torch.randn(*lead, cols, rows).transpose(-1, -2).to(dtype)
    if layout == "strided":  # a slice: neither dim contiguous
        return torch.randn(*lead, rows, 3 * cols)[..., 1::3].to(dtype)
    return torch.randn(*lead, rows, cols).to(dtype)


def run(problem: GemmProblem, p: dict, a, b, eps=(), out=None):
    rendered = TEMPLATE.render(problem, p, CPU)
    launch = load_module(rendered.source, name="test_gemm", interpret=True).launch
    if out is None:
        shape = (problem.batch, problem.M, problem.N) if problem.batched else (problem.M, problem.N)
        out = torch.full(shape, float("nan"), dtype=getattr(torch, {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[problem.out_dtype]))
    return launch(a, b, *eps, out=out)


def problem_for(a, b, out_dtype=None, epilogue=(), inputs=(), batched=False):
    return GemmProblem(
        M=a.shape[-2], N=b.shape[-1], K=a.shape[-1], batch=max(a.shape[0], b.shape[0]) if batched else 1,
        batched=batched, dtype=DTYPE_NAMES[a.dtype], out_dtype=DTYPE_NAMES[out_dtype or a.dtype],
        layout_a=layout_of(a), layout_b=layout_of(b), epilogue=tuple(epilogue),
        epilogue_inputs=tuple(inputs))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("shape", [(1, 1, 1), (17, 33, 65), (100, 72, 40), (127, 257, 509)],
                         ids=lambda s: "x".join(map(str, s)))
def test_plain_gemm_matches_float64(shape, dtype):
    M, N, K = shape
    a, b = matrix(M, K, "row", dtype), matrix(K, N, "col", dtype)
    p = params(64, 64, 64) if K > 256 else params()
    out = run(problem_for(a, b), p, a, b)
    ref = a.double() @ b.double()
    assert not out.isnan().any(), "unwritten output elements"
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("layout_a", ["row", "col", "strided"])
@pytest.mark.parametrize("layout_b", ["row", "col", "strided"])
def test_operand_layouts_are_read_through_strides(layout_a, layout_b):
    a, b = matrix(17, 65, layout_a, torch.float32), matrix(65, 33, layout_b, torch.float32)
    out = run(problem_for(a, b), params(16, 16, 16), a, b)
    assert rel_err(out, a.double() @ b.double()) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: DTYPE_NAMES[d])
def test_batched_with_broadcast_operand(dtype):
    a = matrix(19, 40, "row", dtype, batch=3)
    b = matrix(40, 23, "col", dtype, batch=1).expand(3, 40, 23)  # batch stride 0
    out = run(problem_for(a, b, batched=True), params(16, 16, 16), a, b)
    assert out.shape == (3, 19, 23)
    assert rel_err(out, a.double() @ b.double()) < TOL[dtype]


def _apply(kind, x, other=None, reverse=False):
    if kind == "add":
        return x + other
    if kind == "sub":
        return other - x if reverse else x - other
    if kind == "mul":
        return x * other
    if kind == "div":
        return other / x if reverse else x / other
    return {"relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
            "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}[kind](x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("kind", ["relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"])
def test_unary_epilogues(kind, dtype):
    a, b = matrix(37, 29, "row", dtype), matrix(29, 45, "col", dtype)
    bias = torch.randn(45, dtype=dtype)
    ops = (EpilogueOp("add", input=0), EpilogueOp(kind))
    prob = problem_for(a, b, epilogue=ops, inputs=(EpilogueInput("N", DTYPE_NAMES[dtype]),))
    out = run(prob, params(16, 32, 16), a, b, [bias.expand(37, 45)])
    ref = _apply(kind, a.double() @ b.double() + bias.double())
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("pattern", ["", "M", "N", "MN"])
@pytest.mark.parametrize("kind,reverse", [("add", False), ("sub", False), ("sub", True),
                                          ("mul", False), ("div", False), ("div", True)])
def test_binary_epilogues_by_broadcast_pattern(kind, reverse, pattern):
    M, N, K = 21, 34, 18
    a, b = matrix(M, K, "row", torch.float32), matrix(K, N, "row", torch.float32)
    shape = [M if "M" in pattern else 1, N if "N" in pattern else 1]
    e = torch.rand(*shape) + 0.5  # away from 0: div is well conditioned
    prob = problem_for(a, b, epilogue=(EpilogueOp(kind, input=0, reverse=reverse, scale=0.75),),
                       inputs=(EpilogueInput(pattern, "fp32"),))
    out = run(prob, params(16, 16, 16), a, b, [e.expand(M, N)])
    ref = _apply(kind, a.double() @ b.double(), e.double() * 0.75, reverse)
    # other / acc blows up where acc ~ 0; compare where the reference is well conditioned
    ok = (a.double() @ b.double()).abs() > 0.1 if (kind, reverse) == ("div", True) else slice(None)
    assert rel_err(out[ok], ref[ok]) < 1e-4


def test_scalar_ops_and_cast_chain():
    """bf16 in, fp32 out: alpha, bias (bf16), silu, residual (fp32), reversed scalar sub."""
    M, N, K = 33, 40, 52
    a, b = matrix(M, K, "row", torch.bfloat16), matrix(K, N, "col", torch.bfloat16)
    bias, res = torch.randn(N, dtype=torch.bfloat16), torch.randn(M, N)
    ops = (EpilogueOp("mul", scalar=0.5), EpilogueOp("add", input=0, scale=2.0),
           EpilogueOp("silu"), EpilogueOp("add", input=1), EpilogueOp("sub", scalar=3.0, reverse=True))
    prob = problem_for(a, b, out_dtype=torch.float32, epilogue=ops,
                       inputs=(EpilogueInput("N", "bf16"), EpilogueInput("MN", "fp32")))
    out = run(prob, params(32, 32, 32), a, b, [bias.expand(M, N), res])
    assert out.dtype == torch.float32
    ref = 3.0 - (F.silu(0.5 * (a.double() @ b.double()) + 2.0 * bias.double()) + res.double())
    assert rel_err(out, ref) < 1e-5


def test_writes_only_inside_a_strided_output_view():
    a, b = matrix(20, 30, "row", torch.float32), matrix(30, 25, "row", torch.float32)
    big = torch.full((24, 40), float("nan"))
    out = big[2:22, 5:30]  # non-contiguous destination
    run(problem_for(a, b), params(16, 16, 16), a, b, out=out)
    assert rel_err(out, a.double() @ b.double()) < 1e-5
    mask = torch.ones_like(big, dtype=torch.bool)
    mask[2:22, 5:30] = False
    assert big[mask].isnan().all(), "kernel wrote outside its output"


def test_k_zero_gives_epilogue_of_zero():
    a, b = torch.randn(5, 0), torch.randn(0, 7)
    bias = torch.randn(7)
    prob = problem_for(a, b, epilogue=(EpilogueOp("add", input=0),), inputs=(EpilogueInput("N", "fp32"),))
    out = run(prob, params(16, 16, 16), a, b, [bias.expand(5, 7)])
    assert torch.equal(out, bias.expand(5, 7))


@settings(max_examples=12, deadline=None)
@given(M=st.integers(1, 70), N=st.integers(1, 70), K=st.integers(1, 90),
       la=st.sampled_from(["row", "col", "strided"]), lb=st.sampled_from(["row", "col", "strided"]),
       bm=st.sampled_from([16, 32, 64]), bk=st.sampled_from([16, 32]))
def test_random_shapes_and_layouts(M, N, K, la, lb, bm, bk):
    a, b = matrix(M, K, la, torch.float32), matrix(K, N, lb, torch.float32)
    out = run(problem_for(a, b), params(bm, 32, bk), a, b)
    assert rel_err(out, a.double() @ b.double()) < 1e-5


# -- CHECK-style assertions on the rendered source ---------------------------------------------
def test_bf16_upcast_only_under_the_interpreter():
    prob = GemmProblem(M=64, N=64, K=64, dtype="bf16")
    cpu_src = TEMPLATE.render(prob, params(), CPU).source
    gpu_src = TEMPLATE.render(prob, params(), get_target("cuda:sm_90a")).source
    assert "a = a.to(tl.float32)" in cpu_src
    assert "a = a.to(tl.float32)" not in gpu_src
    assert 'input_precision="ieee"' in cpu_src  # the upcast dot is a real fp32 dot


def test_fp32_uses_ieee_unless_tf32_allowed():
    import tilewright

    prob = GemmProblem(M=64, N=64, K=64, dtype="fp32")
    sm90 = get_target("cuda:sm_90a")
    assert 'input_precision="ieee"' in TEMPLATE.render(prob, params(), sm90).source
    with tilewright.config.patch(allow_tf32=True):
        assert 'input_precision="tf32"' in TEMPLATE.render(prob, params(), sm90).source


def test_64_bit_indexing_for_huge_or_dynamic_problems():
    small = GemmProblem(M=1024, N=1024, K=1024, dtype="bf16")
    huge = GemmProblem(M=32768, N=128256, K=4096, dtype="bf16")  # output > 2**31 elements
    dynamic = GemmProblem(M=64, N=1024, K=1024, dtype="bf16", dynamic=frozenset({"M"}))
    assert "offs_m.to(tl.int64)" not in TEMPLATE.render(small, params(), CPU).source
    assert "offs_m.to(tl.int64)" in TEMPLATE.render(huge, params(), CPU).source
    assert "offs_m.to(tl.int64)" in TEMPLATE.render(dynamic, params(), CPU).source


def test_illegal_params_are_refused_before_rendering():
    from tilewright.errors import UnsupportedProblemError

    prob = GemmProblem(M=4096, N=4096, K=4096, dtype="fp32")
    big = {**params(256, 256, 256), "num_stages": 6, "num_warps": 8}
    assert "shared memory" in TEMPLATE.check(big, prob, get_target("cuda:sm_90a"))
    with pytest.raises(UnsupportedProblemError, match="shared memory"):
        TEMPLATE.render(prob, big, get_target("cuda:sm_90a"))
    assert TEMPLATE.check(big, prob, CPU) is None  # the interpreter has no such limit
    with pytest.raises(UnsupportedProblemError, match="Triton does not generate"):
        TEMPLATE.render(prob, params(), get_target("mps"))
