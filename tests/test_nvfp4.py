"""NVFP4: the format against hand-computed values, the scale swizzle, the Triton NVFP4 GEMM in
the interpreter, and a quantised model compiling to one GEMM kernel per layer."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import rel_err

import tilewright
from tilewright.errors import InvalidInputError
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem
from tilewright.quant import nvfp4
from tilewright.quant.linear import NVFP4Linear, quantize_linears
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template


# -- E2M1 --------------------------------------------------------------------------------------
def test_e2m1_codes_of_every_representable_value():
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    codes = nvfp4.e2m1_encode(values)
    assert codes.tolist() == list(range(8))
    assert nvfp4.e2m1_encode(-values[1:]).tolist() == list(range(9, 16))
    assert torch.equal(nvfp4.e2m1_decode(torch.arange(16, dtype=torch.uint8))[:8], values)


@pytest.mark.parametrize("x,expected", [
    (0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0),  # ties to even
    (0.26, 0.5), (2.6, 3.0), (5.1, 6.0),                                                      # nearest
    (7.0, 6.0), (1e9, 6.0), (float("inf"), 6.0), (-100.0, -6.0),                             # saturation
    (float("nan"), 0.0),                                                                      # no NaN in E2M1
])
def test_e2m1_rounding(x, expected):
    got = nvfp4.e2m1_decode(nvfp4.e2m1_encode(torch.tensor([x]))).item()
    assert got == expected


def test_negative_zero_keeps_its_sign():
    code = nvfp4.e2m1_encode(torch.tensor([-0.0]))
    assert code.item() == 8 and math.copysign(1, nvfp4.e2m1_decode(code).item()) == -1


def test_packing_puts_even_elements_in_the_low_nibble():
    codes = torch.tensor([[1, 2, 3, 15]], dtype=torch.uint8)
    packed = nvfp4.pack_e2m1(codes)
    assert packed.tolist() == [[0x21, 0xF3]]
    assert torch.equal(nvfp4.unpack_e2m1(packed), codes)
    assert nvfp4.unpack_e2m1(packed.view(torch.float4_e2m1fn_x2)).tolist() == codes.tolist()


# -- NVFP4 tensors -------------------------------------------------------------------------------
def _block(values):
    return torch.tensor(values + [0.0] * (16 - len(values)))


def test_quantize_hand_computed():
    # amax 2688 = 448 * 6 makes the global decode scale exactly 1
    b0 = _block([2688.0, 1344.0, -448.0])             # block amax 2688: scale 448, codes 6, 3, -1
    b1 = _block([6.0, 3.0, 1.5, 0.5, -0.25])           # scale 1: exact except -0.25 -> -0 (tie to even)
    b2 = torch.zeros(16)                               # zero block: scale 0, values 0
    b3 = _block([6 * 2.0**-8, 3 * 2.0**-8])           # scale 2^-8: an E4M3 subnormal, still exact
    x = torch.stack([b0, b1, b2, b3]).reshape(1, 64)
    q = nvfp4.quantize(x)
    assert q.global_scale.item() == 1.0
    assert q.scale.float().tolist() == [[448.0, 1.0, 0.0, 2.0**-8]]
    d = q.dequantize()
    expected = torch.stack([_block([2688.0, 1344.0, -448.0]), _block([6.0, 3.0, 1.5, 0.5, -0.0]),
                            torch.zeros(16), _block([6 * 2.0**-8, 3 * 2.0**-8])]).reshape(1, 64)
    assert torch.equal(d, expected)
    assert q.data.shape == (1, 32) and q.scale.dtype == torch.float8_e4m3fn


def test_calibrated_global_scale_saturates_outliers():
    x = torch.tensor([[1000.0] + [1.0] * 15])
    q = nvfp4.quantize(x, global_scale=torch.tensor(1.0))  # calibrated for amax 2688 > 1000: fine
    assert q.dequantize()[0, 0].item() == pytest.approx(1000.0, rel=0.25)
    q = nvfp4.quantize(x, global_scale=torch.tensor(0.01))  # calibrated far too small
    assert q.scale.float().max().item() == 448.0  # the E4M3 scale saturates instead of overflowing
    assert q.dequantize()[0, 0].item() == pytest.approx(6 * 448 * 0.01)
    assert not q.dequantize().isnan().any()


def test_round_trip_error_of_gaussian_data():
    x = torch.randn(256, 512)
    err = rel_err(nvfp4.quantize(x).dequantize(), x)
    assert 0.05 < err < 0.15  # ~3 bits of mantissa with a shared scale per 16


def test_quantize_refuses_bad_input():
    with pytest.raises(InvalidInputError, match="multiple of 16"):
        nvfp4.quantize(torch.randn(4, 40))
    with pytest.raises(InvalidInputError, match="float"):
        nvfp4.quantize(torch.ones(4, 16, dtype=torch.int32))


# -- scale swizzle -------------------------------------------------------------------------------
@pytest.mark.parametrize("rows,cols", [(128, 4), (200, 12), (1, 1), (300, 7)])
def test_swizzle_is_a_permutation_with_known_positions(rows, cols):
    scale = torch.arange(1, rows * cols + 1, dtype=torch.float32).view(rows, cols)
    out = nvfp4.swizzle_scales(scale)
    R, C = -(-rows // 128) * 128, -(-cols // 4) * 4
    assert out.numel() == R * C
    for r in range(rows):
        for c in range(cols):
            assert out[nvfp4.swizzled_index(r, c, cols)] == scale[r, c]
    assert sorted(out[out > 0].tolist()) == scale.flatten().tolist()  # padding is zeros
    # the first 128x4 tile: row 33, column 2 -> (33 % 32) * 16 + (33 // 32) * 4 + 2 = 22
    if rows > 33 and cols > 2:
        assert out[22] == scale[33, 2]


# -- the Triton NVFP4 GEMM in the interpreter ----------------------------------------------------
def _problem(M, N, K, extra_ops=(), extra_inputs=()):
    ops = (EpilogueOp("mul", input=0), EpilogueOp("mul", input=1)) + tuple(extra_ops)
    inputs = (EpilogueInput("", "fp32"), EpilogueInput("", "fp32")) + tuple(extra_inputs)
    return GemmProblem(M=M, N=N, K=K, dtype="nvfp4", out_dtype="fp32", layout_b="col",
                       scale_layout="row", epilogue=ops, epilogue_inputs=inputs)


@pytest.mark.parametrize("M", [1, 2, 4, 8, 16, 48, 100])
def test_triton_nvfp4_gemm_matches_dequantised_fp32(M):
    N, K = 80, 192
    a, b = nvfp4.quantize(torch.randn(M, K)), nvfp4.quantize(torch.randn(N, K) * 3)
    bias, res = torch.randn(N), torch.randn(M, N)
    prob = _problem(M, N, K, (EpilogueOp("add", input=2), EpilogueOp("gelu"), EpilogueOp("add", input=3)),
                    (EpilogueInput("N", "fp32"), EpilogueInput("MN", "fp32")))
    params = {"BLOCK_M": 16 if M <= 16 else 32, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 4,
              "num_warps": 4, "num_stages": 2}
    launch = load_module(get_template("triton.gemm_nvfp4").render(prob, params, get_target("cpu")).source,
                         name="nvfp4", interpret=True).launch
    out = torch.full((M, N), float("nan"))
    launch(a.data, b.data, a.global_scale.expand(M, N), b.global_scale.expand(M, N),
           bias.expand(M, N), res, out=out, a_scale=a.scale, b_scale=b.scale)
    ref = F.gelu(nvfp4.reference_mm(a, b).double() + bias.double()) + res.double()
    assert rel_err(out, ref) < 1e-5  # fp32 rounding: the dequantised tiles are exact


def test_dot_scaled_variant_refuses_the_interpreter_and_hopper():
    import triton

    t = get_template("triton.gemm_nvfp4_mma")
    prob = _problem(64, 64, 64)
    assert "misreads" in t.supports(prob, get_target("cpu")).reason
    assert not t.supports(prob, get_target("cuda:sm_90a"))
    new_enough = tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 9)
    assert bool(t.supports(prob, get_target("cuda:sm_100a"))) == new_enough


@pytest.mark.slow
def test_dot_scaled_variant_uses_block_scaled_tcgen05(tmp_path):
    from tilewright.runtime.aot import CompileJob, compile_jobs
    from tilewright.runtime.verify import verify

    t, target = get_template("triton.gemm_nvfp4_mma"), get_target("cuda:sm_100a")
    prob = _problem(256, 512, 512)
    if not t.supports(prob, target):
        pytest.skip(t.supports(prob, target).reason)
    params = t.space.default()
    r = t.render(prob, params, target)
    (res,) = compile_jobs([CompileJob("nvfp4_mma", r.source, r.aot.to_json(), target.triton)], tmp_path)
    assert res.ok, res.error
    v = verify({k: tmp_path / p for k, p in res.artifacts.items()}, t.expected_instructions(prob, params, target))
    assert v.ok, v.failures


# -- NVFP4 models through the backend -----------------------------------------------------------
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.mid, self.down = nn.Linear(64, 128), nn.Linear(128, 128), nn.Linear(128, 64)

    def forward(self, x):
        h = F.silu(self.up(x))
        h = torch.relu(self.mid(h)) * 0.5
        return self.down(h) + x


@pytest.mark.parametrize("mode", ["auto", "triton"])
def test_quantised_model_has_one_gemm_kernel_per_layer(mode, tmp_path):
    torch.manual_seed(0)
    m = Net()
    assert quantize_linears(m) == 3
    x = torch.randn(2, 8, 64)
    with torch.no_grad():
        eager = m(x)
        with tilewright.config.patch(force_backend=mode, debug_dir=str(tmp_path)):
            out = torch.compile(m, backend="tilewright")(x)
    assert rel_err(out, eager) < 1e-2  # same quantised arithmetic, up to rounding flips
    (wrapper,) = list(tmp_path.glob("run_*/*/wrapper.py"))
    lines = [ln.strip() for ln in wrapper.read_text().splitlines() if "=" in ln and not ln.strip().startswith("#")]
    launches = [ln for ln in lines if "= gemm_" in ln]
    assert len(launches) == 3, launches
    # header bindings (`_op_* = ...`) aside; views are the tensor's own method (`x.view`), other
    # ops their overload's C++ entry (`_op_<namespace>_<op>_<overload>`)
    others = [ln.split("=", 1)[1].strip().split("(")[0] for ln in lines if "= gemm_" not in ln
              and not ln.startswith(("aten =", "prims =", "gemm_", "(", "_op_"))]
    compute = [o for o in others if not o.endswith(".view") and o not in (
        "_op_aten__unsafe_view_default", "operator.getitem", "_op_tilewright_nvfp4_quantize_default")]
    assert not compute, f"kernels besides the GEMMs and activation quantisation: {compute}"


def test_nvfp4_linear_module():
    lin = nn.Linear(32, 24)
    q = NVFP4Linear.from_linear(lin)
    x = torch.randn(5, 32)
    ref = F.linear(x, q.dequantized_weight(), lin.bias)
    assert rel_err(q(x), ref) < 0.25  # activation quantisation (W4A4)
    q.calibrate(x)
    assert q.input_global_scale.item() == pytest.approx(x.abs().max().item() / (448 * 6))
    with pytest.raises(InvalidInputError, match="divisible by 16"):
        NVFP4Linear(20, 8)
    net = nn.Sequential(nn.Linear(20, 32), nn.Linear(32, 8))
    assert quantize_linears(net) == 1  # 20 is not a multiple of 16: kept in float


class QuantisedDecoderMLP(nn.Module):
    """The W4A4 half of a decoder layer: RMSNorm -> NVFP4 gate_up -> SwiGLU -> NVFP4 down, plus
    the residual (attention aside)."""

    def __init__(self, H=64, inter=128):
        super().__init__()
        self.norm = nn.RMSNorm(H, eps=1e-6)
        self.gate_up, self.down = nn.Linear(H, 2 * inter, bias=False), nn.Linear(inter, H, bias=False)

    def forward(self, x):
        g, u = self.gate_up(self.norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


def test_calibrated_decoder_layers_launch_four_kernels_each():
    """With calibrated activation scales each quantisation is written by its producer's kernel
    (the norm, the SwiGLU): per layer one norm+quantise kernel, the gate_up GEMM, one
    SwiGLU+quantise kernel and the down GEMM (residual in its epilogue), and no ATen call."""
    from tilewright.compiler.report import collect_reports

    torch.manual_seed(0)
    layers = 2
    m = nn.Sequential(*(QuantisedDecoderMLP() for _ in range(layers)))
    assert quantize_linears(m) == 2 * layers
    x = torch.randn(2, 8, 64)
    with torch.no_grad():
        h = x
        for layer in m:  # calibrate each linear on its own input
            layer.gate_up.calibrate(layer.norm(h))
            g, u = layer.gate_up(layer.norm(h)).chunk(2, dim=-1)
            layer.down.calibrate(F.silu(g) * u)
            h = layer(h)
        eager = m(x)
        with tilewright.config.patch(force_backend="auto"), collect_reports() as reports:
            out = torch.compile(m, backend="tilewright")(x)
    assert torch.equal(out, eager)  # the same quantised arithmetic, bit for bit on the CPU
    (report,) = reports
    assert report.launches <= 4 * layers, (report.kernel_counts, report.extern_ops)
    assert report.gemm_nodes == 2 * layers and report.extern_ops == 0
    # unfused (TILEWRIGHT_FUSE_QUANTISATION=0): each quantisation is a launch of its own
    torch._dynamo.reset()
    with torch.no_grad(), tilewright.config.patch(force_backend="auto", fuse_quantisation=False), \
            collect_reports() as reports:
        unfused = torch.compile(m, backend="tilewright")(x)
    assert torch.equal(unfused, eager)
    assert reports[0].launches == 6 * layers, (reports[0].kernel_counts, reports[0].extern_ops)
