"""FlyDSL kernels on a ROCm gfx950 GPU, through their modules' ``launch``, against float64 into
NaN-poisoned outputs. Skipped everywhere else: no gfx950 has run these yet (the CI machines have
no GPU, the device-check machine is an H200). On a gfx950 with ROCm torch and ``flydsl``:
``pytest -m gpu tests/test_flydsl_device.py``."""

from __future__ import annotations

import pytest
import torch

from tilewright import grouped
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.inputs import make_inputs, poisoned_output, rel_error, tolerance
from tilewright.grouped import GroupedGemmProblem
from tilewright.compiler.kernel_factory import default_factory
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem
from tilewright.templates.flydsl import launch as rt
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

pytestmark = pytest.mark.gpu
GFX950 = get_target("hip:gfx950")


@pytest.fixture(autouse=True)
def gfx950():
    why = rt.device_problem(torch.device("cuda")) if torch.cuda.is_available() else "no GPU"
    if why:
        pytest.skip(f"needs a ROCm gfx950 GPU with flydsl: {why}")


def _build(template_id: str, problem, params=None):
    t = get_template(template_id)
    params = params or t.seed_params(problem, GFX950)[0]
    return default_factory.build(problem, Candidate.of(t.id, t.source_hash, params), GFX950)


@pytest.mark.parametrize("M", [1, 77, 256])
def test_flydsl_gemm_with_bias_gelu_matches_float64(M):
    p = GemmProblem(M=M, N=200, K=512, dtype="bf16", layout_b="col",
                    epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu")),
                    epilogue_inputs=(EpilogueInput("N", "bf16"),))
    x = make_inputs(p, "cuda")
    out = poisoned_output(p, "cuda")
    _build("flydsl.gemm", p)(x.a, x.b, *x.epilogue_inputs, out=out)
    torch.cuda.synchronize()
    assert rel_error(out, default_factory.reference(p, x)) <= tolerance(p)


def test_flydsl_grouped_gemm_with_empty_and_one_token_groups_matches_float64():
    p = GroupedGemmProblem(case="2d3d", G=5, M=90, N=128, K=256, dtype="bf16", layout_b="col",
                           epilogue=(EpilogueOp("add", input=0),), epilogue_inputs=(EpilogueInput("BN", "bf16"),))
    offs = torch.tensor([0, 1, 1, 60, 88], dtype=torch.int32, device="cuda")  # rows 88, 89 unwritten
    x = grouped.make_inputs(p, "cuda", offs=offs)
    out = grouped.poisoned_output(p, "cuda")
    grouped.run(_build("flydsl.grouped_gemm", p), x, out)
    torch.cuda.synchronize()
    ref = grouped.reference(p, x)
    assert rel_error(out[:88], ref[:88]) <= tolerance(p.as_gemm()) and out[88:].isnan().all()


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_flydsl_mx_gemm_matches_float64(fmt):
    p = GemmProblem(M=100, N=136, K=512, dtype=fmt, out_dtype="bf16", layout_b="col", scale_layout="row")
    x = make_inputs(p, "cuda")
    out = poisoned_output(p, "cuda")
    _build("flydsl.mx_gemm", p)(x.a, x.b, out=out, **x.scale_kwargs)
    torch.cuda.synchronize()
    assert rel_error(out, default_factory.reference(p, x)) <= tolerance(p)


def test_eager_rms_norm_and_topk_are_right_whichever_path_the_gate_takes():
    from tilewright.kernels import rms_norm, topk

    x, w = torch.randn(33, 4096, device="cuda").bfloat16(), torch.randn(4096, device="cuda").bfloat16()
    ref = torch.nn.functional.rms_norm(x.double(), (4096,), w.double(), 1e-6)
    assert rel_error(rms_norm(x, w, 1e-6), ref) <= 1e-2
    logits = torch.randn(1000, 128, device="cuda")
    values, indices = topk(logits, 8)
    assert torch.equal(values, torch.topk(logits, 8).values) and torch.equal(logits.gather(1, indices), values)
