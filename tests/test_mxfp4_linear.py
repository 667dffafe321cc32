"""MXFP4 (and MXFP8) per OCP MX v1.0: quantisation against an independent float64 rounding,
``MXFP4Linear`` against a float64 dequantised reference, the ATen template on MX problems with a
poisoned output, a compiled model equal to eager, and the lowering to the MX GemmProblem."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import rel_err

import tilewright
from tilewright.compiler.capture import ModelSpec, capture_kernels
from tilewright.errors import InvalidInputError
from tilewright.kernels.mx import mx_problem
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem
from tilewright.quant import mx
from tilewright.quant.linear import MXFP4Linear, MXFP8Linear, NVFP4Linear, quantize_linears
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def reference_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dequantised values, scale exponents) by the spec's words, in float64 and Python math:
    X = 2^(floor(log2 amax) - 2), each |x/X| to the nearest E2M1 magnitude (a tie to the one
    with mantissa bit 0, i.e. the even code), clamped at 6."""
    blocks = x.double().reshape(*x.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1)
    exps = torch.tensor([math.floor(math.log2(a)) - 2 if a > 0 else -127 for a in amax.flatten().tolist()],
                        dtype=torch.float64).reshape(amax.shape)
    scaled = (blocks / torch.exp2(exps).unsqueeze(-1)).abs().clamp(max=6.0)
    dist = (scaled.unsqueeze(-1) - E2M1).abs()
    best = dist.min(-1, keepdim=True).values
    # among the nearest codes, prefer an even one (its only competitor on a tie is odd)
    tied = dist == best
    even = tied & (torch.arange(8) % 2 == 0)
    code = torch.where(even.any(-1), even.int().argmax(-1), tied.int().argmax(-1))
    vals = E2M1[code] * torch.sign(blocks) * torch.exp2(exps).unsqueeze(-1)
    return vals.reshape(x.shape), exps


# -- the format ------------------------------------------------------------------------------------
def test_hand_computed_blocks():
    x = torch.zeros(3, 32)
    x[0, :4] = torch.tensor([1.0, 0.3, -0.125, 0.0])  # amax 1 -> X = 2^-2: 4, 1.2->1, -0.5, 0
    x[1, :3] = torch.tensor([7.0, 5.0, 3.5])          # amax 7 -> X = 1: 7 clips to 6, 5->4, 3.5->4 (ties to even)
    q = mx.quantize(x, "mxfp4")
    assert q.scale.dtype == torch.float8_e8m0fnu and q.data.dtype == torch.uint8 and q.data.shape == (3, 16)
    assert q.scale.view(torch.uint8).flatten().tolist() == [125, 127, 0]  # all-zero block: 2^-127
    d = q.dequantize()
    assert d[0, :4].tolist() == [1.0, 0.25, -0.125, 0.0]
    assert d[1, :3].tolist() == [6.0, 4.0, 4.0]
    assert torch.equal(d[2], torch.zeros(32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mxfp4_round_trip_equals_the_float64_rounding(dtype):
    g = torch.Generator().manual_seed(3)
    # ragged rows, magnitudes over many octaves per row so blocks get different scales
    x = (torch.randn(37, 160, generator=g) * torch.exp2(torch.randint(-6, 7, (37, 5), generator=g).float()
                                                          ).repeat_interleave(32, -1)).to(dtype)
    q = mx.quantize(x, "mxfp4")
    want, exps = reference_mxfp4(x)
    assert torch.equal(q.scale.view(torch.uint8).long() - 127, exps.long())
    assert torch.equal(q.dequantize(torch.float64), want)
    err = rel_err(q.dequantize(), x.double())
    assert 0.02 < err < 0.2, err  # 4-bit values: ~12% of the signal, not 0 (a no-op quantiser)


def test_mxfp8_round_trip_by_dtype():
    g = torch.Generator().manual_seed(4)
    for dtype, bound in ((torch.float32, 0.05), (torch.bfloat16, 0.05)):
        x = (torch.randn(19, 96, generator=g) * 40).to(dtype)
        q = mx.quantize(x, "mxfp8")
        assert q.data.dtype == torch.float8_e4m3fn and q.data.shape == x.shape
        amax = x.double().reshape(19, 3, 32).abs().amax(-1)
        scale = mx.scale_values(q.scale, torch.float64)
        assert torch.all((amax / scale >= 256) & (amax / scale < 512))  # emax(E4M3) = 8
        assert 1e-3 < rel_err(q.dequantize(), x.double()) < bound


def test_ragged_k_and_bad_inputs_are_refused():
    with pytest.raises(InvalidInputError, match="multiple of 32.*pad K with zeros to 64"):
        mx.quantize(torch.randn(4, 48), "mxfp4")
    with pytest.raises(InvalidInputError, match="float tensors"):
        mx.quantize(torch.ones(4, 32, dtype=torch.int32))
    with pytest.raises(InvalidInputError, match="not an MX format"):
        mx.quantize(torch.randn(4, 32), "nvfp4")
    with pytest.raises(InvalidInputError, match="divisible by 32"):
        MXFP4Linear(48, 8)
    q = mx.quantize(torch.randn(4, 64))
    with pytest.raises(InvalidInputError, match="b_scale"):
        torch.ops.tilewright.mx_mm(q.data, q.scale, q.data, q.scale[:, :1], None, None, "mxfp4", torch.float32)


# -- the layer -------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls,dtype,tol", [(MXFP4Linear, torch.float32, 1e-5), (MXFP4Linear, torch.bfloat16, 1e-2),
                                            (MXFP8Linear, torch.float32, 1e-5)])
def test_linear_forward_matches_a_float64_dequantised_reference(cls, dtype, tol):
    torch.manual_seed(0)
    lin = nn.Linear(96, 40).to(dtype)
    q = cls.from_linear(lin)
    x = torch.randn(3, 5, 96).to(dtype)
    with torch.no_grad():
        out = q(x)
    assert out.shape == (3, 5, 40) and out.dtype == dtype
    xq = mx.quantize(x.reshape(-1, 96), q.fmt)
    w64 = mx.dequantize_packed(q.weight, q.weight_scale, q.fmt, torch.float64)
    ref = (xq.dequantize(torch.float64) @ w64.t() + lin.bias.double()).reshape(3, 5, 40)
    assert rel_err(out, ref) < tol
    # and it is still the layer it replaced, up to W4A4 / W8A8 quantisation
    exact = F.linear(x.double(), lin.weight.double(), lin.bias.double())
    assert rel_err(out, exact) < (0.3 if q.fmt == "mxfp4" else 0.08)
    x.requires_grad_(True)
    with pytest.raises(InvalidInputError, match="inference-only"):
        q(x)


def test_quantize_linears_by_format():
    net = nn.Sequential(nn.Linear(48, 64), nn.Linear(64, 32), nn.Linear(32, 8))
    assert quantize_linears(net, fmt="mxfp4") == 2  # 48 is not a multiple of 32: kept in float
    assert [type(m).__name__ for m in net] == ["Linear", "MXFP4Linear", "MXFP4Linear"]
    old = nn.Sequential(nn.Linear(48, 16))
    assert quantize_linears(old) == 1 and isinstance(old[0], NVFP4Linear)  # the old call: NVFP4
    with pytest.raises(InvalidInputError, match="unknown format"):
        quantize_linears(old, fmt="int4")


# -- the GEMM: ATen template, compiled model, lowering --------------------------------------------
@pytest.mark.parametrize("fmt,M", [("mxfp4", 1), ("mxfp4", 37), ("mxfp8", 20)])
def test_aten_template_on_mx_problems_with_a_poisoned_output(fmt, M):
    N, K = 72, 160
    g = torch.Generator().manual_seed(M)
    a, sa = mx.random_operand(fmt, M, K, g)
    b, sb = mx.random_operand(fmt, N, K, g)
    alpha, bias = torch.tensor(0.75), torch.randn(N, generator=g)
    prob = mx_problem(M, N, K, fmt, torch.float32, alpha, bias)
    assert prob.epilogue == (EpilogueOp("mul", input=0), EpilogueOp("add", input=1))
    source = get_template("aten.gemm").render(prob, {}, get_target("cpu")).source
    launch = load_module(source, name="mx_aten", interpret=False).launch
    da = mx.dequantize_packed(a, sa, fmt, torch.float64)
    db = mx.dequantize_packed(b, sb, fmt, torch.float64)
    ref = da @ db.t() * 0.75 + bias.double()
    for out_dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):  # the reference, then a run
        out = torch.full((M, N), float("nan"), dtype=out_dtype)
        launch(a, b, alpha.expand(M, N), bias.expand(M, N), out=out, a_scale=sa, b_scale=sb)
        assert rel_err(out, ref) < tol
    eager = torch.ops.tilewright.mx_mm(a, sa, b, sb, alpha, bias, fmt, torch.float32)
    assert rel_err(eager, ref) < 1e-5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(64, 96), nn.Linear(96, 64, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)) * 0.5) + x


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_compiled_model_equals_eager_with_one_gemm_per_layer(tmp_path, fmt):
    torch.manual_seed(0)
    m = Net()
    assert quantize_linears(m, fmt=fmt) == 2
    x = torch.randn(2, 7, 64)
    with torch.no_grad():
        eager = m(x)
        with tilewright.config.patch(debug_dir=str(tmp_path)):
            out = torch.compile(m, backend="tilewright")(x)
    # the same fp32 arithmetic (ATen template); only the fused relu*0.5 epilogue may round differently
    assert rel_err(out, eager) < 1e-5
    (wrapper,) = list(tmp_path.glob("run_*/*/wrapper.py"))
    calls = [ln.split("=", 1)[1].strip().split("(")[0] for ln in wrapper.read_text().splitlines()
             if "=" in ln and ln.startswith("    ") and not ln.strip().startswith(("#", "("))]
    assert sum(c.startswith("gemm_") for c in calls) == 2, calls  # relu*0.5 and the residual fused
    # views are the tensor's own method (`x.view`), other ops their overload's C++ entry
    others = {c for c in calls if not c.endswith(".view")} - {"gemm_0", "gemm_1", "operator.getitem"}
    # each activation quantisation is a loop kernel (kinds/loop/lower/quantize_mx.py) whose
    # scale bytes are viewed as E8M0 (free); the ATen quantiser is gone
    assert others - {"_op_aten_view_dtype"} == {"kernel_0", "kernel_2"}, others


def test_lowering_gives_the_mx_gemm_problem():
    model = nn.Sequential(MXFP4Linear.from_linear(nn.Linear(128, 80).to(torch.bfloat16)))
    captured = capture_kernels(ModelSpec(model.eval(), (torch.randn(6, 128, dtype=torch.bfloat16),)))
    (problem,) = [c.problem for c in captured if isinstance(c.problem, GemmProblem)]
    assert problem == GemmProblem(
        M=6, N=80, K=128, dtype="mxfp4", out_dtype="bf16", layout_a="row", layout_b="col",
        scale_layout="row", epilogue=(EpilogueOp("add", input=0),),
        epilogue_inputs=(EpilogueInput("N", "bf16"),), op="mx_mm")
    assert problem == mx_problem(6, 80, 128, "mxfp4", torch.bfloat16, None, model[0].bias)


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_value_makes_its_block_nan_and_no_other(fmt, bad):
    # OCP MX v1.0 6.3: the block gets the NaN scale (255); a NaN input must not come out finite
    x = torch.randn(3, 96)
    x[1, 40] = bad
    q = mx.quantize(x, fmt)
    out = mx.dequantize_packed(q.data, q.scale, fmt)
    nan = torch.isnan(out)
    assert nan[1, 32:64].all() and nan.sum() == 32
    assert q.scale.view(torch.uint8)[1, 1] == 255
