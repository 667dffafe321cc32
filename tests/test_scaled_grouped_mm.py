"""PyTorch's block-scaled ``F.scaled_grouped_mm`` / ``torch._scaled_grouped_mm`` (MoE experts in
MXFP8, MXFP4, NVFP4) lowered to tilewright's Triton grouped GEMM that dequantises in its
prologue, the activation fused: checked on the CPU (interpreter) against a float64 dequantised
reference with ragged groups (an empty one included) and NaN-poisoned outputs; torch's per-group
swizzled scale layout decoded; calls that do not fit stay ATen's with a reason; the fake-tensor
capture (torch has no Meta kernel for ``_scaled_grouped_mm_v2``) and AOT builds for sm_90a and
sm_100a."""

from __future__ import annotations

import pytest
import torch
from conftest import rel_err

import tilewright
from tilewright.compiler.capture import ModelSpec, aten_graphs
from tilewright.demo.scaled_grouped import moe_example
from tilewright.errors import InvalidInputError
from tilewright.kernels import scaled_grouped
from tilewright.kinds.grouped_gemm.lower_scaled import OP, rewrite_all
from tilewright.quant import mx, nvfp4
from tilewright.quant.nvfp4 import swizzle_scales
from tilewright.quant.scales import swizzled_numel, unswizzle_groups, unswizzle_stacked

BF16_TOL = 1e-2  # a bf16 output: ~2^-9 of rounding
FP32_TOL = 1e-6  # fp32 output: the exact dequantised products, summed in fp32


def test_per_group_swizzled_scales_decode_to_rows():
    """Each group's scales swizzled on their own (torch's layout for the token operand), an empty
    group and groups that are not multiples of 128 rows; rows past offs[-1] are ignored."""
    g = torch.Generator().manual_seed(0)
    sizes, cols = [37, 0, 130, 5], 3
    rows = torch.randint(0, 256, (sum(sizes) + 4, cols), generator=g, dtype=torch.uint8)
    ends = torch.tensor(sizes).cumsum(0)
    blocks = [swizzle_scales(rows[e - s:e]) for s, e in zip(sizes, ends.tolist()) if s]
    flat = torch.cat(blocks)
    assert flat.numel() == sum(swizzled_numel(s, cols) for s in sizes if s)
    got = unswizzle_groups(flat, ends.to(torch.int32), rows.shape[0], cols)
    assert torch.equal(got[:sum(sizes)], rows[:sum(sizes)])
    with pytest.raises(InvalidInputError, match="128-row tiles"):
        unswizzle_groups(flat[:-1], ends.to(torch.int32), rows.shape[0], cols)


def test_stacked_swizzled_scales_decode_per_expert():
    g = torch.Generator().manual_seed(1)
    want = torch.randint(0, 256, (3, 70, 5), generator=g, dtype=torch.uint8)
    flat = torch.stack([swizzle_scales(w) for w in want])
    assert torch.equal(unswizzle_stacked(flat, 3, 70, 5), want)
    with pytest.raises(InvalidInputError, match="need"):
        unswizzle_stacked(flat[:2], 3, 70, 5)


def _operands(fmt: str, sizes, N: int, K: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    G, M = len(sizes), sum(sizes)
    x, w = torch.randn(M, K, generator=g) * 3, torch.randn(G, N, K, generator=g)
    if fmt == "nvfp4":
        qa, qb = nvfp4.quantize(x, torch.ones(())), [nvfp4.quantize(w[i], torch.ones(())) for i in range(G)]
        ga, gb = torch.rand(G, generator=g) + 0.5, torch.rand(G, generator=g) + 0.5
    else:
        qa, qb, ga, gb = mx.quantize(x, fmt), [mx.quantize(w[i], fmt) for i in range(G)], None, None
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    return (qa.data, qa.scale, torch.stack([q.data for q in qb]), torch.stack([q.scale for q in qb]), offs, ga, gb)


@pytest.mark.parametrize("fmt,activation,out_dtype,glu", [
    ("mxfp8", "silu", torch.float32, "none"), ("mxfp4", "none", torch.float32, "none"),
    ("nvfp4", "gelu", torch.float32, "none"), ("mxfp8", "none", torch.bfloat16, "none"),
    ("mxfp8", "none", torch.float32, "silu"), ("nvfp4", "relu", torch.float32, "gelu")])
def test_the_kernel_matches_float64_on_ragged_groups(fmt, activation, out_dtype, glu):
    """Groups of 20, 0 (empty), 37 and 7 tokens (none a multiple of the 32-row tile), K = 96 (a
    partial K step), N = 40 (a partial tile); the output poisoned with NaN: every grouped row
    is written, the 5 rows past offs[-1] are not."""
    a, sa, b, sb, offs, ga, gb = _operands(fmt, [20, 0, 37, 7], N=40, K=96)
    pad = 5  # rows after the last group
    a = torch.cat([a.view(torch.uint8), torch.zeros(pad, a.shape[1], dtype=torch.uint8)]).view(a.dtype)
    sa = torch.cat([sa.view(torch.uint8), torch.full((pad, sa.shape[1]), 127, dtype=torch.uint8)]).view(sa.dtype)
    launch = scaled_grouped._launcher(fmt, out_dtype, activation, ga is not None, a.device, glu)
    out = torch.full((a.shape[0], 20 if glu != "none" else 40), float("nan"), dtype=out_dtype)
    launch(a, sa, b, sb, offs, ga, gb, out=out)
    ref = scaled_grouped.reference(a, sa, b, sb, offs, ga, gb, fmt=fmt, activation=activation, glu=glu)
    rows = int(offs[-1])
    assert not out[:rows].isnan().any() and out[rows:].isnan().all()
    tol = FP32_TOL if out_dtype == torch.float32 else BF16_TOL
    assert rel_err(out[:rows], ref[:rows]) < tol, rel_err(out[:rows], ref[:rows])


def test_bad_operands_are_refused_with_the_fix():
    a, sa, b, sb, offs, *_ = _operands("mxfp8", [8, 8], N=16, K=64)
    with pytest.raises(InvalidInputError, match="int32 end offsets"):
        scaled_grouped.scaled_grouped_mm(a, sa, b, sb, offs.long(), fmt="mxfp8")
    with pytest.raises(InvalidInputError, match="row-major scales"):
        scaled_grouped.scaled_grouped_mm(a, sa[:, :1], b, sb, offs, fmt="mxfp8")
    with pytest.raises(InvalidInputError, match="contiguous along K"):
        scaled_grouped.scaled_grouped_mm(a, sa, b.transpose(1, 2).contiguous().transpose(1, 2), sb, offs, fmt="mxfp8")


def _wrapper_calls(tmp_path) -> list[str]:
    (wrapper,) = list(tmp_path.glob("run_*/*/wrapper.py"))
    return [ln.split("=", 1)[1].strip().split("(")[0] for ln in wrapper.read_text().splitlines()
            if "=" in ln and ln.startswith("    ") and not ln.strip().startswith(("#", "("))]


@pytest.mark.slow
@pytest.mark.parametrize("recipe,swizzled", [("mxfp8", True), ("mxfp4", True), ("nvfp4_global", True),
                                             ("mxfp8", False)])
def test_compiled_moe_is_one_grouped_kernel_with_the_activation(tmp_path, recipe, swizzled):
    """``silu(F.scaled_grouped_mm(...))``, which eager torch cannot run on a CPU, compiled: the
    scales decoded, one block-scaled grouped GEMM with the silu fused, against float64."""
    torch._dynamo.reset()
    model, args = moe_example(recipe, swizzled=swizzled)
    with pytest.raises((NotImplementedError, RuntimeError)):
        model(*args)
    with torch.no_grad(), tilewright.config.patch(debug_dir=str(tmp_path)):
        out = torch.compile(model, backend="tilewright")(*args)
    ref = model.reference(*args)
    assert out.dtype == torch.bfloat16 and rel_err(out, ref) < BF16_TOL, rel_err(out, ref)
    calls = _wrapper_calls(tmp_path)
    assert sum("scaled_grouped_mm" in c for c in calls) == 1, calls
    assert not [c for c in calls if "silu" in c.lower() and "scaled_grouped" not in c], calls


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4_global"])
def test_gate_up_projection_fuses_its_gated_product(tmp_path, recipe):
    """The MoE expert MLP's ``silu(gate) * up`` after the block-scaled gate_up call: one
    kernel writes the (M_total, N/2) product (no split, silu or mul left), against float64."""
    torch._dynamo.reset()
    model, args = moe_example(recipe, sizes=(9, 0, 23), glu=True)
    with torch.no_grad(), tilewright.config.patch(debug_dir=str(tmp_path)):
        out = torch.compile(model, backend="tilewright")(*args)
    ref = model.reference(*args)
    assert out.shape == (32, 32) and rel_err(out, ref) < BF16_TOL, rel_err(out, ref)
    calls = _wrapper_calls(tmp_path)
    assert sum("scaled_grouped_mm" in c for c in calls) == 1, calls
    assert not [c for c in calls if any(w in c.lower() for w in ("silu", "mul", "split", "slice"))], calls


def test_v1_mxfp8_call_lowers_too():
    """``torch._scaled_grouped_mm`` with E8M0 scales (MXFP8; swizzled, as CUDA's torch infers)."""
    model, (x, offs, sa) = moe_example("mxfp8")
    w, ws = model.w, model.w_scale

    def f(x, offs, sa):
        return torch._scaled_grouped_mm(x, w.transpose(-2, -1), sa.reshape(-1, 4), ws, offs=offs,
                                        out_dtype=torch.bfloat16)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(f, backend="tilewright")(x, offs, sa)
    rows = int(offs[-1])
    want = model.reference(x, offs, sa)[:rows]  # silu of the product: compare the same
    assert rel_err(torch.nn.functional.silu(out[:rows].double()), want) < BF16_TOL


@pytest.mark.slow
def test_token_counts_that_vary_at_run_time():
    """``dynamic=True``: one compiled graph for two token splits of different totals (the A
    scales' length follows them)."""
    torch._dynamo.reset()
    model, _ = moe_example("mxfp8")
    f = torch.compile(model, backend="tilewright", dynamic=True)
    for sizes in [(20, 0, 37, 7), (5, 40, 0, 90)]:
        _, args = moe_example("mxfp8", sizes=sizes)
        with torch.no_grad():
            out = f(*args)
        ref = model.reference(*args)
        assert out.shape == (sum(sizes), 64) and rel_err(out, ref) < BF16_TOL, (sizes, rel_err(out, ref))


@pytest.mark.parametrize("change,reason", [
    (lambda a: a.__setitem__(6, [2]), "different recipes"),
    (lambda a: a.__setitem__(11, [0, 1]), "contraction_dim"),
    (lambda a: a.__setitem__(4, [7]), "swizzle type 7"),
])
def test_calls_that_do_not_fit_stay_aten_with_a_reason(change, reason):
    model, args = moe_example("mxfp8")
    (gm,) = aten_graphs(ModelSpec(model, args)).values()
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten._scaled_grouped_mm_v2.default]
    new = list(node.args) + [None] * (12 - len(node.args))
    new[11] = new[11] or []
    change(new)
    node.args = tuple(new)
    before = len(gm.graph.nodes)
    assert rewrite_all(gm) == 0 and len(gm.graph.nodes) == before
    assert reason in node.meta["tilewright_aten_reason"], node.meta["tilewright_aten_reason"]


def test_fake_tensors_trace_f_scaled_grouped_mm():
    """Torch 2.11/2.13 register no Meta kernel for ``_scaled_grouped_mm_v2``: fake tracing ran it
    on the CPU and failed, so no backend ever saw the call. tilewright registers one: the graph
    holds the call with its (M_total, N) bf16 value, and lowering retargets it."""
    model, args = moe_example("mxfp8", sizes=(8, 0, 9))
    (gm,) = aten_graphs(ModelSpec(model, args)).values()
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten._scaled_grouped_mm_v2.default]
    val = node.meta["val"]
    assert tuple(val.shape) == (17, 64) and val.dtype == torch.bfloat16
    assert rewrite_all(gm) == 2  # retargeted, then the silu folded into it
    (op,) = [n for n in gm.graph.nodes if n.target is OP]
    assert op.args[7:] == ("mxfp8", torch.bfloat16, "silu", "none")


@pytest.mark.slow
@pytest.mark.parametrize("fmt,glu", [("mxfp8", "none"), ("mxfp4", "none"), ("nvfp4", "silu")])
def test_the_kernel_builds_for_sm90a_and_sm100a_with_their_mma(tmp_path, fmt, glu):
    from tilewright.problem import GemmProblem
    from tilewright.runtime.aot import CompileJob, compile_jobs
    from tilewright.runtime.targets import get_target
    from tilewright.runtime.verify import verify
    from tilewright.templates.triton.gemm import mma_checks

    jobs, targets = [], [get_target(n) for n in ("sm_90a", "sm_100a")]
    for t in targets:
        spec = scaled_grouped.aot_spec(fmt, torch.bfloat16, t.name)
        jobs.append(CompileJob(f"{fmt}_{t.name}", scaled_grouped.render(fmt, torch.bfloat16, target=t.name, glu=glu),
                               spec.to_json(), t.triton))
    for t, res in zip(targets, compile_jobs(jobs, tmp_path)):
        assert res.ok, res.error[-800:]
        params = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}
        checks = mma_checks(GemmProblem(M=256, N=256, K=256, dtype="bf16"), params, t)
        v = verify({k: tmp_path / p for k, p in res.artifacts.items()}, checks)
        assert checks and v.ok, (t.name, v.failures)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4_global"])
def test_scaled_grouped_mm_compiled_on_the_gpu(recipe):
    """On the device (eager torch needs sm_100 and FBGEMM for these; tilewright's dequantising
    kernel runs on any Triton GPU): ragged groups with an empty one, against float64."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch._dynamo.reset()
    model, args = moe_example(recipe, sizes=(200, 0, 77, 300), N=192, K=256)
    ref = model.reference(*args)
    with torch.no_grad():
        out = torch.compile(model.cuda(), backend="tilewright")(*[a.cuda() for a in args])
    assert out.is_cuda and rel_err(out.cpu(), ref) < BF16_TOL, rel_err(out.cpu(), ref)


def test_a_gpu_without_e4m3_conversions_is_told_so(monkeypatch):
    """sm_80: Triton cannot convert e4m3 values or scales there; a clear error, not a compile failure."""
    from tilewright.runtime import targets

    monkeypatch.setattr(targets, "detect_target", lambda device: targets.get_target("sm_80"))
    with pytest.raises(InvalidInputError, match="sm_89 or later"):
        scaled_grouped._launcher("mxfp8", torch.bfloat16, "none", False, torch.device("cpu"))
