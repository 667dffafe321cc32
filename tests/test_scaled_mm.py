"""PyTorch's own block-scaled ``F.scaled_mm`` / ``torch._scaled_mm`` (MXFP8, MXFP4, NVFP4, swizzled
and plain scales) lowered to one block-scaled GEMM with the epilogue fused, checked on the CPU
against a float64 dequantised reference; the SWIZZLE_32_4_4 decoder against the layout's
definition; calls that do not fit stay ATen's with a reason; the AOT capture of a model this
host cannot run."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.fx as fx
from conftest import rel_err

import tilewright
from tilewright.compiler.capture import ModelSpec, aten_graphs, capture_kernels
from tilewright.compiler.lower_scaled import MX_MM, NVFP4_MM, rewrite_all
from tilewright.demo.scaled import dequantize, example, quantize
from tilewright.errors import InvalidInputError
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem
from tilewright.quant.nvfp4 import swizzle_scales
from tilewright.quant.scales import rows_of, swizzled_numel, unswizzle

BF16_TOL = 1e-2  # a bf16 output: ~2^-9 of rounding, plus the fp32 accumulation order


def cublas_offset(r: int, c: int, cols: int) -> int:
    """Where scale (r, c) lives in the 1D block-scaling layout, by the cuBLAS documentation's
    words (the formula torch's ``from_blocked`` test helper uses): 128x4 tiles in row-major
    order over the padded matrix, inside one ``(r % 32) * 16 + (r % 128 // 32) * 4 + c % 4``."""
    tiles_per_row = -(-cols // 4)
    return 512 * ((r // 128) * tiles_per_row + c // 4) + (r % 32) * 16 + (r % 128) // 32 * 4 + c % 4


@pytest.mark.parametrize("rows,cols", [(1, 1), (37, 3), (128, 4), (130, 5), (257, 9)])
def test_unswizzle_reads_the_documented_layout(rows, cols):
    g = torch.Generator().manual_seed(rows * 31 + cols)
    flat = torch.randint(0, 256, (swizzled_numel(rows, cols),), generator=g, dtype=torch.uint8)
    want = torch.tensor([[flat[cublas_offset(r, c, cols)].item() for c in range(cols)] for r in range(rows)],
                        dtype=torch.uint8)
    got = unswizzle(flat.view(torch.float8_e8m0fnu), rows, cols)
    assert got.dtype == torch.float8_e8m0fnu and torch.equal(got.view(torch.uint8), want)
    # a 2-D view of the same bytes (torch accepts any shape with that count) reads the same
    assert torch.equal(unswizzle(flat.reshape(-1, 16), rows, cols), want)
    assert torch.equal(unswizzle(swizzle_scales(want), rows, cols), want)  # the writer's inverse


def test_scale_layouts_refuse_wrong_counts():
    with pytest.raises(InvalidInputError, match="need 512 elements"):
        unswizzle(torch.zeros(500, dtype=torch.uint8), 37, 3)
    with pytest.raises(InvalidInputError, match="NO_SWIZZLE"):
        rows_of(torch.zeros(10, dtype=torch.uint8), 4, 3)


def _wrapper_calls(tmp_path) -> list[str]:
    (wrapper,) = list(tmp_path.glob("run_*/*/wrapper.py"))
    return [ln.split("=", 1)[1].strip().split("(")[0] for ln in wrapper.read_text().splitlines()
            if "=" in ln and ln.startswith("    ") and not ln.strip().startswith(("#", "("))]


CASES = [("mxfp8", "F"), ("mxfp8", "v1"), ("mxfp4", "F"), ("mxfp4", "v1"), ("nvfp4", "F"), ("nvfp4", "v1"),
         ("nvfp4_global", "F")]


@pytest.mark.parametrize("recipe,api", CASES)
def test_swizzled_scaled_mm_is_one_gemm_with_the_epilogue(tmp_path, recipe, api):
    """Ragged M and N (37, 72; the scales' padding in use), random non-zero inputs, swizzled
    scales; the compiled model (which eager torch cannot run on a CPU) against float64."""
    torch._dynamo.reset()
    model, args = example(recipe, M=37, N=72, K=128 if recipe == "mxfp4" else 96, api=api)
    with torch.no_grad(), tilewright.config.patch(debug_dir=str(tmp_path)):
        out = torch.compile(model, backend="tilewright")(*args)
    ref = model.reference(*args)
    assert out.dtype == torch.bfloat16 and out.shape == (37, 72)
    assert rel_err(out, ref) < BF16_TOL, rel_err(out, ref)
    calls = _wrapper_calls(tmp_path)
    assert sum(c.startswith("gemm_") for c in calls) == 1, calls  # bias and gelu fused into it
    assert not [c for c in calls if "scaled_mm" in c or "gelu" in c], calls


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4_global"])
def test_tokens_that_vary_at_run_time(recipe):
    """A dynamic M (a decode step's tokens): the scales' rows follow the call's M. Each call is
    checked; the third is where the CPU graph race runs the model's own ops, which cannot run
    here: the compiled graph wins instead of the call failing."""
    torch._dynamo.reset()
    model, _ = example(recipe, M=37, N=72, K=128)
    f = torch.compile(model, backend="tilewright", dynamic=True)
    for M in (37, 5, 130, 16):
        x, scales = quantize(torch.randn(M, 128, generator=torch.Generator().manual_seed(M)) * 3, recipe, True)
        with torch.no_grad():
            out = f(x, *scales)
        assert out.shape == (M, 72) and rel_err(out, model.reference(x, *scales)) < BF16_TOL, M


def test_plain_scales_as_rocm_torch_takes_them(tmp_path):
    """NO_SWIZZLE (ROCm's layout): torch.version.hip makes torch's own checks expect it."""
    torch._dynamo.reset()
    model, args = example("mxfp8", M=64, N=64, K=96, swizzled=False)
    assert args[1].shape == (64, 3)
    with torch.no_grad(), mock.patch.object(torch.version, "hip", "7.0"):
        out = torch.compile(model, backend="tilewright")(*args)
    assert rel_err(out, model.reference(*args)) < BF16_TOL


def _scaled_mm_graph(recipe: str, M: int, N: int, K: int, swizzled: bool):
    """A hand-built ATen graph of one ``_scaled_mm_v2`` (torch's own fake checks accept some
    layouts only on some builds), its real inputs and the model that made them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model, args = example(recipe, M=M, N=N, K=K, swizzled=swizzled)
    w_scales = model.w_scales()
    reals = [args[0], model.w, *args[1:], *w_scales, model.bias]
    mode = FakeTensorMode()
    g = fx.Graph()
    ph = []
    for i, t in enumerate(reals):
        p = g.placeholder(f"arg{i}")
        p.meta["val"] = mode.from_tensor(t)
        ph.append(p)
    n_s = len(args) - 1
    x, w, xs, ws, bias = ph[0], ph[1], ph[2:2 + n_s], ph[2 + n_s:2 + 2 * n_s], ph[-1]
    t = g.call_function(torch.ops.aten.t.default, (w,))
    with mode:
        t.meta["val"] = w.meta["val"].t()
    block = 3 if recipe.startswith("mx") else 2
    recipes = [block, 0] if recipe == "nvfp4_global" else [block]
    swz = [1 if swizzled else 0] + ([0] if recipe == "nvfp4_global" else [])
    mm = g.call_function(torch.ops.aten._scaled_mm_v2.default,
                         (x, t, xs, recipes, swz, ws, recipes, swz, bias, torch.bfloat16))
    with mode:
        mm.meta["val"] = torch.empty(M, N, dtype=torch.bfloat16)
    g.output((mm,))
    return fx.GraphModule(torch.nn.Module(), g), reals, model, args


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4", "nvfp4", "nvfp4_global"])
@pytest.mark.parametrize("swizzled", [True, False])
def test_rewrite_decodes_each_recipe_and_layout(recipe, swizzled):
    """The rewritten graph, run eagerly (tilewright's ops dequantise in fp32), equals the float64
    reference of the same operands: each recipe's scales are read where torch puts them."""
    gm, reals, model, args = _scaled_mm_graph(recipe, 37, 72, 128, swizzled)
    assert rewrite_all(gm) == 1
    (op,) = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in (MX_MM, NVFP4_MM)]
    assert op.target is (NVFP4_MM if recipe == "nvfp4_global" else MX_MM)
    (out,) = gm(*reals)
    # the graph has no gelu: the product and the bias
    ref = (dequantize(args[0], list(args[1:]), recipe, swizzled)
           @ dequantize(model.w, model.w_scales(), recipe, swizzled).t() + model.bias.double())
    assert rel_err(out, ref) < BF16_TOL


@pytest.mark.parametrize("change,reason", [
    ({"a_dtype": torch.float8_e5m2}, "operands"),
    ({"recipe": [4]}, "scale recipe"),
    ({"swizzle": [1], "bad_count": True}, "SWIZZLE_32_4_4 scales with"),
])
def test_calls_that_do_not_fit_stay_aten_with_a_reason(change, reason):
    gm, *_ = _scaled_mm_graph("mxfp8", 37, 72, 96, True)
    (mm,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten._scaled_mm_v2.default]
    args = list(mm.args)
    if "a_dtype" in change:
        x = args[0]
        x.meta["val"] = x.meta["val"].to(change["a_dtype"])
        args[1].meta["val"] = args[1].meta["val"].to(change["a_dtype"])
    if "recipe" in change:
        args[3] = args[6] = change["recipe"]
    if change.get("bad_count"):
        s = args[2][0]
        s.meta["val"] = s.meta["val"][:100]
    mm.args = tuple(args)
    before = len(gm.graph.nodes)
    assert rewrite_all(gm) == 0
    assert mm.target is torch.ops.aten._scaled_mm_v2.default and len(gm.graph.nodes) == before
    assert reason in mm.meta["tilewright_aten_reason"], mm.meta["tilewright_aten_reason"]


def test_issue_model_is_captured_with_fake_tensors():
    """The issue's model: eager torch cannot run it here ("CPU does not support swizzle", or in torch
    2.11 no CPU kernel at all); the
    capture still lowers it to one MXFP8 GEMM problem with the bias and gelu fused."""
    model, args = example("mxfp8")
    with pytest.raises((ValueError, NotImplementedError, RuntimeError)):  # torch 2.13 / 2.11 wording
        model(*args)
    (problem,) = [c.problem for c in capture_kernels(ModelSpec(model, args)) if isinstance(c.problem, GemmProblem)]
    assert problem == GemmProblem(
        M=40, N=96, K=128, dtype="mxfp8", out_dtype="bf16", layout_a="row", layout_b="col",
        scale_layout="row", epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu")),
        epilogue_inputs=(EpilogueInput("N", "bf16"),), op="mx_mm")
    (gm,) = aten_graphs(ModelSpec(model, args)).values()
    assert any(n.target is torch.ops.aten._scaled_mm_v2.default for n in gm.graph.nodes)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4_global"])
def test_scaled_mm_compiled_on_the_gpu(recipe):
    """On the device (an H100 has no block-scaled MMA, so eager torch refuses MX there; tilewright
    runs it on its dequantising templates): ragged M, the epilogue fused, against float64."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch._dynamo.reset()
    model, args = example(recipe, M=37, N=96, K=256)
    ref = model.reference(*args)
    model = model.cuda()
    with torch.no_grad():
        out = torch.compile(model, backend="tilewright")(*[a.cuda() for a in args])
    assert out.is_cuda and rel_err(out.cpu(), ref) < BF16_TOL, rel_err(out.cpu(), ref)


@pytest.mark.parametrize("recipe", ["TensorWise", "RowWise"])
def test_fp8_tensor_and_row_wise_scaled_mm_is_one_gemm(tmp_path, recipe):
    """``F.scaled_mm`` with fp8 tensor- or row-wise recipes: the fp8 GEMM with its scales, bias and
    relu in the epilogue (as ``torch._scaled_mm`` lowers)."""
    from torch.nn.functional import ScalingType

    g = torch.Generator().manual_seed(5)
    x = (torch.randn(37, 64, generator=g) * 3).to(torch.float8_e4m3fn)
    w = (torch.randn(48, 64, generator=g) * 3).to(torch.float8_e4m3fn)
    if recipe == "TensorWise":
        sa, sb = torch.tensor(0.5), torch.tensor(2.0)
    else:
        sa, sb = torch.rand(37, 1, generator=g) + 0.5, torch.rand(1, 48, generator=g) + 0.5
    bias = torch.randn(48, generator=g).to(torch.bfloat16)
    r = getattr(ScalingType, recipe)

    def f(x, w, sa, sb, bias):
        return torch.relu(torch.nn.functional.scaled_mm(x, w.t(), sa, r, sb, r, bias=bias,
                                                        output_dtype=torch.bfloat16))

    torch._dynamo.reset()
    with tilewright.config.patch(debug_dir=str(tmp_path)):
        out = torch.compile(f, backend="tilewright")(x, w, sa, sb, bias)
    ref = torch.relu(x.double() @ w.double().t() * sa.double() * sb.double() + bias.double())
    assert rel_err(out, ref) < BF16_TOL
    calls = _wrapper_calls(tmp_path)
    assert sum(c.startswith("gemm_") for c in calls) == 1 and not [c for c in calls if "relu" in c], calls
