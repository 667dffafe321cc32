"""Today's new GPU-side paths on a CUDA GPU, so the first GPU lent checks them: the block-scaled
grouped GEMM templates (``F.scaled_grouped_mm``: the dequantising template on any GPU with e4m3
conversions, the ``tl.dot_scaled`` one where the target has a block-scaled MMA) compiled for the
device against the float64 dequantised reference with ragged groups and a NaN-poisoned output;
and an SDPA whose float mask requires grad compiled with generated kernels forced (one attention
kernel each way, the mask's gradient included) against float64. Skipped without CUDA;
bench/device_check.sh runs every ``gpu``-marked file."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tilewright
from tilewright.compiler.report import collect_reports

pytestmark = pytest.mark.gpu


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


@pytest.fixture
def target():
    from tilewright.runtime.targets import detect_target

    return detect_target("cuda")


@pytest.mark.parametrize("template_id,fmt", [("triton.grouped_gemm_scaled", "mxfp8"),
                                             ("triton.grouped_gemm_scaled", "nvfp4"),
                                             ("triton.grouped_gemm_scaled_mma", "mxfp8")])
def test_scaled_grouped_templates_match_float64_on_the_gpu(target, template_id, fmt):
    from tilewright.kinds.grouped_gemm import checks
    from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem
    from tilewright.problem import EpilogueOp
    from tilewright.runtime.loader import load_module
    from tilewright.templates import get_template

    p = GroupedGemmProblem("2d3d", 4, 300, 192, 256, fmt, out_dtype="bf16", layout_b="col",
                           epilogue=(EpilogueOp("silu"),), global_scales=fmt == "nvfp4", op="scaled_grouped_mm")
    template = get_template(template_id)
    why = template.supports(p, target)
    if not why:
        pytest.skip(f"{template_id} on {target.name}: {why.reason}")
    offs = torch.tensor([100, 100, 237, 290], dtype=torch.int32, device="cuda")  # an empty group, 10 rows past
    x = checks.make_inputs(p, "cuda", seed=11, offs=offs)
    ref = checks.reference(p, x)
    for params in (template.seed_params(p, target) or [{}])[:3]:
        if template.check(template.space.complete(params), p, target):
            continue
        r = template.render(p, template.space.complete(params), target)
        launch = load_module(r.source, name=r.name, interpret=False).launch
        out = checks.run(launch, x, checks.poisoned_output(p, "cuda"))
        torch.cuda.synchronize()
        assert not out[:290].isnan().any() and out[290:].isnan().all(), params
        assert rel_err(out[:290], ref[:290]) < 1e-2, (params, rel_err(out[:290], ref[:290]))


def test_a_float_mask_requiring_grad_runs_one_attention_kernel_each_way_on_the_gpu():
    g = torch.Generator(device="cuda").manual_seed(3)
    B, H, S, D = 2, 4, 96, 64
    q, k, v = (torch.randn(B, H, S, D, device="cuda", generator=g, requires_grad=True) for _ in range(3))
    mask = torch.randn(B, 1, S, S, device="cuda", generator=g)
    mask[:, :, 5] = torch.finfo(torch.float32).min  # a fully masked row: eager's mean of V
    mask.requires_grad_(True)
    leaves = [q, k, v, mask]

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    go = torch.randn(B, H, S, D, device="cuda", generator=g)
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(fn, backend="tilewright")(*leaves)
        grads = torch.autograd.grad(out, leaves, go)
    d64 = [t.detach().double().requires_grad_(True) for t in leaves]
    ref = fn(*d64)
    want = torch.autograd.grad(ref, d64, go.double())
    kinds = {r.kind: [k.winner for k in r.kernels if k.kind == "attention"] for r in reports}
    assert kinds.get("forward") and kinds.get("backward"), kinds
    # fp32 attention may take tf32 on the GPU (~5e-4): a wrong P on the masked row is off by 2.3
    assert rel_err(out, ref) < 5e-3
    for name, got, w in zip("q k v mask".split(), grads, want):
        assert rel_err(got, w) < 2e-2, (name, rel_err(got, w))
