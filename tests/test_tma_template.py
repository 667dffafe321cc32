"""The tensor-descriptor (TMA/TDM) template's numbers in the Triton interpreter, which runs
descriptors on the CPU: layouts, epilogues, ragged edges, misaligned operands, persistence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import TOL, rel_err

from tilewright.problem import DTYPE_NAMES, EpilogueInput, EpilogueOp, GemmProblem
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

TMA = get_template("triton.gemm_tma")
CPU = get_target("cpu")


def run(problem, a, b, eps=(), bm=32, bn=32, bk=32):
    params = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 4, "num_warps": 4, "num_stages": 3}
    launch = load_module(TMA.render(problem, params, CPU).source, name="tma", interpret=True).launch
    shape = (problem.M, problem.N)
    dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[problem.out_dtype]
    out = torch.full(shape, float("nan"), dtype=dt)
    return launch(a, b, *eps, out=out)


def operand(rows, cols, layout, dtype):
    if layout == "col":
        return torch.randn(cols, rows).to(dtype).t()
    return torch.randn(rows, cols).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("la,lb", [("row", "col"), ("row", "row"), ("col", "row"), ("col", "col")])
def test_layouts_and_dtypes(la, lb, dtype):
    M, N, K = 72, 104, 88  # ragged against 32-tiles; rows stay 16-byte aligned
    a, b = operand(M, K, la, dtype), operand(K, N, lb, dtype)
    prob = GemmProblem(M=M, N=N, K=K, dtype=DTYPE_NAMES[dtype], layout_a=la, layout_b=lb)
    out = run(prob, a, b)
    assert not out.isnan().any()
    assert rel_err(out, a.double() @ b.double()) < TOL[dtype]


def test_epilogue_and_many_tiles_per_program():
    # 6x5 tiles over 3 persistent programs: each walks 10 tiles
    M, N, K = 192, 160, 64
    a, b = operand(M, K, "row", torch.bfloat16), operand(K, N, "col", torch.bfloat16)
    bias, res = torch.randn(N), torch.randn(M, N)
    ops = (EpilogueOp("add", input=0), EpilogueOp("gelu"), EpilogueOp("add", input=1, scale=0.5))
    prob = GemmProblem(M=M, N=N, K=K, dtype="bf16", out_dtype="fp32", layout_b="col", epilogue=ops,
                       epilogue_inputs=(EpilogueInput("N", "fp32"), EpilogueInput("MN", "fp32")))
    out = run(prob, a, b, [bias.expand(M, N), res])
    ref = F.gelu(a.double() @ b.double() + bias.double()) + 0.5 * res.double()
    assert rel_err(out, ref) < 1e-5


def test_misaligned_operand_is_copied_not_misread():
    M, N, K = 32, 48, 64
    base = torch.randn(M * K + 1)
    a = base[1:].view(M, K)  # data pointer 4 bytes off 16-byte alignment
    b = torch.randn(K, N)
    prob = GemmProblem(M=M, N=N, K=K, dtype="fp32")
    assert rel_err(run(prob, a, b), a.double() @ b.double()) < 1e-5


def test_fp8_with_row_and_column_scales():
    M, N, K = 48, 64, 96
    a = torch.randn(M, K).to(torch.float8_e4m3fn)
    b = torch.randn(N, K).to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(M, 1) + 0.5, torch.rand(1, N) + 0.5
    prob = GemmProblem(M=M, N=N, K=K, dtype="fp8e4m3", out_dtype="bf16", layout_b="col",
                       epilogue=(EpilogueOp("mul", input=0), EpilogueOp("mul", input=1)),
                       epilogue_inputs=(EpilogueInput("M", "fp32"), EpilogueInput("N", "fp32")))
    out = run(prob, a, b, [sa.expand(M, N), sb.expand(M, N)], bk=32)
    ref = (a.double() @ b.double()) * sa.double() * sb.double()
    assert rel_err(out, ref) < 1e-2


def test_dynamic_ragged_k_is_padded_at_launch():
    # compiled for a dynamic K, launched with K = 65: rows of 65 fp32 are not 16-byte multiples
    M, N, K = 32, 48, 65
    a, b = torch.randn(M, K), torch.randn(N, K).t()
    prob = GemmProblem(M=M, N=N, K=64, dtype="fp32", layout_b="col", dynamic=frozenset({"K"}))
    assert TMA.supports(prob, CPU)
    assert rel_err(run(prob, a, b), a.double() @ b.double()) < 1e-5
