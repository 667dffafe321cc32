"""Activation quantisation fused into its producer's loop kernel (compiler/loops/quantize.py):
the fused kernel writes the same bytes and scales as the unfused quantiser, in every emitter
that runs it, and a quantised decoder layer launches 4 kernels."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from test_loop_kernels import FACTORY, loop_problems

import tilewright
from tilewright.autotune.kinds import make_loop_inputs, poisoned_loop_outputs
from tilewright.compiler.report import collect_reports
from tilewright.quant import nvfp4
import tilewright.quant.ops  # noqa: F401 - registers torch.ops.tilewright.nvfp4_quantize (Q below)
from tilewright.quant.linear import quantize_linears
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

Q = torch.ops.tilewright.nvfp4_quantize


def _norm_quant(x, w, gs):
    h = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
    out = Q(h.reshape(-1, h.shape[-1]), gs)  # its global-scale output unread
    return h, out[0], out[1]


def _swiglu_quant(gate_up, gs):
    g, u = gate_up.chunk(2, dim=-1)
    h = F.silu(g) * u
    out = Q(h.reshape(-1, h.shape[-1]), gs)  # its global-scale output unread
    return h, out[0], out[1]


def _add_quant(x, r, gs):
    h = x + r
    out = Q(h, gs)
    return h, out[0], out[1]


def _special(x: torch.Tensor) -> torch.Tensor:
    """``x`` with values that test the rounding rules: E2M1 midpoints (ties), an exact E4M3
    scale boundary, zeros, a block of zeros, -0, a huge outlier (saturation)."""
    x = x.clone()
    flat = x.view(-1)
    flat[:16] = torch.tensor([6.0, 2.5, 0.75, 1.25, 1.75, 3.5, 5.0, 0.25, -2.5, -0.0, 0.0, 1.0, -6.0, 4.0, 3.0, 0.5])
    flat[16:32] = 0.0
    flat[40] = 1e6
    return x


def _inputs(case, dtype, rows=24, K=96):
    g = torch.Generator().manual_seed(7)
    gs = torch.tensor(2.0 / (448 * 6))  # calibrated for |h| ~ 2: outliers saturate
    if case == "norm":
        x = torch.randn(rows, K, generator=g).to(dtype)
        return _norm_quant, (x, torch.randn(K, generator=g).to(dtype), gs)
    if case == "swiglu":
        return _swiglu_quant, (_special(torch.randn(rows, 2 * K, generator=g)).to(dtype), gs)
    # a residual add of a transposed (non-contiguous) operand
    return _add_quant, (_special(torch.randn(rows, K, generator=g)).to(dtype),
                        torch.randn(K, rows, generator=g).to(dtype).t(), gs)


def _assert_same_quantisation(h, q, s, gs):
    ref = nvfp4.quantize(h.reshape(-1, h.shape[-1]), gs)
    assert torch.equal(q, ref.data), f"{(q != ref.data).sum().item()} packed bytes differ"
    assert torch.equal(s.view(torch.uint8), ref.scale.view(torch.uint8)), "block scales differ"


@pytest.mark.parametrize("case", ["norm", "swiglu", "add"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_quantisation_is_bit_exact(case, dtype):
    """One kernel computes the producer and its quantisation; its bytes are the unfused
    quantiser's on the producer's own stored output."""
    fn, args = _inputs(case, dtype)
    with tilewright.config.patch(force_backend="auto"), collect_reports() as reports:
        h, q, s = torch.compile(fn, backend="tilewright", dynamic=False)(*args)
    _assert_same_quantisation(h, q, s, args[-1])
    (report,) = reports
    assert report.launches == 1 and report.loop_kernels == 1, report.kernel_counts


def _fp32_scales(problem):
    """The problem with its E4M3 scale buffer stored as fp32: the values are E4M3-exact already
    (the rounding is IR arithmetic), and the Triton interpreter and the C++ emitter take no fp8
    buffers. What the emitters compute is then compared to the quantiser's scales."""
    k = problem.kernel
    outs = tuple(dataclasses.replace(b, dtype="fp32") if b.dtype == "fp8e4m3" else b for b in k.outputs)
    return dataclasses.replace(problem, kernel=dataclasses.replace(k, outputs=outs))


@pytest.mark.parametrize("emitter,params", [
    ("triton", dict(XBLOCK=2, PERSISTENT=True)), ("triton", dict(XBLOCK=1, PERSISTENT=False, RBLOCK=32)),
    ("cpp", {}),
])
def test_emitters_render_the_fused_norm_quantisation(emitter, params):
    fn, args = _inputs("norm", torch.float32, rows=5, K=64)
    (problem,) = loop_problems(fn, *args)
    assert problem.kind == "reduction" and len(problem.kernel.outputs) == 3
    problem = _fp32_scales(problem)
    cpu = get_target("cpu")
    template = get_template(f"{emitter}.reduction")
    if not template.supports(problem, cpu):
        pytest.skip(template.supports(problem, cpu).reason)
    launch = FACTORY.compile(template.render(problem, template.space.complete(params), cpu))
    x = make_loop_inputs(problem, "cpu", seed=3)
    tensors = [t if t.dim() else args[-1] for t in x.tensors]  # the calibrated global scale
    h, q, s = launch(*tensors, *x.sizes, outs=poisoned_loop_outputs(problem, "cpu"))
    ref = nvfp4.quantize(h, args[-1])
    assert torch.equal(q, ref.data)
    assert torch.equal(s, ref.scale.float())


def test_pointwise_producer_renders_in_the_triton_interpreter():
    fn, args = _inputs("swiglu", torch.float32, rows=6, K=32)
    (problem,) = loop_problems(fn, *args)
    problem = _fp32_scales(problem)
    cpu = get_target("cpu")
    template = get_template("triton.pointwise")
    launch = FACTORY.compile(template.render(problem, template.space.complete(dict(XBLOCK=64)), cpu))
    x = make_loop_inputs(problem, "cpu", seed=3)
    tensors = [t if t.dim() else args[-1] for t in x.tensors]
    h, q, s = launch(*tensors, *x.sizes, outs=poisoned_loop_outputs(problem, "cpu"))
    ref = nvfp4.quantize(h, args[-1])
    assert torch.equal(q, ref.data) and torch.equal(s, ref.scale.float())


def test_refusals_keep_the_unfused_op():
    x = torch.randn(4, 40)  # K not a multiple of 16: the op raises as it does in eager
    with pytest.raises(Exception, match="multiple of 16"):
        torch.compile(lambda t: Q(t, torch.tensor(0.01))[0], backend="tilewright")(x)
    # a per-call global scale (the whole tensor's amax) stays the ATen op, and is right
    x = torch.randn(8, 32)
    with collect_reports() as reports:
        q, s, g = torch.compile(lambda t: Q(t * 2, None), backend="tilewright")(x)
    ref = nvfp4.quantize(x * 2)
    assert torch.equal(q, ref.data) and torch.equal(g, ref.global_scale)
    (report,) = reports
    assert report.extern_ops == 1 and report.loop_kernels == 1  # x * 2, then the op


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", ["norm", "swiglu"])
def test_gpu_fused_quantisation_is_bit_exact(case):
    """On the GPU the fused kernel is Triton's (fp8 stores compile there): the same bytes and
    scales as the quantiser's torch ops on the producer's stored output (its divisions
    included: a Triton fp32 division that is not correctly rounded would show here)."""
    fn, args = _inputs(case, torch.bfloat16, rows=33, K=256)
    args = tuple(a.cuda() for a in args)
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        h, q, s = torch.compile(fn, backend="tilewright", dynamic=False)(*args)
    _assert_same_quantisation(h, q, s, args[-1])
    (report,) = reports
    assert report.loop_kernels == 1 and report.extern_ops == 0
    assert all(k.winner.startswith("triton.") for k in report.kernels), [k.winner for k in report.kernels]


@pytest.mark.parametrize("case", ["norm", "swiglu"])
def test_fused_kernel_builds_for_blackwell_with_ieee_divisions(case, tmp_path):
    """``tilewright aot``'s build of the fused kernel for sm_100a (the NVFP4 GEMM's chip): the
    divisions are correctly rounded (div.rn.f32: Triton's "/" is div.full.f32, within 2 ulp,
    which would move scales and codes off the quantiser's), the scales are stored as E4M3, and
    with PDL the kernel waits and releases."""
    from tilewright.runtime.aot import CompileJob, compile_jobs
    from tilewright.runtime.pdl import triton_pdl_refusal

    fn, args = _inputs(case, torch.bfloat16, rows=8, K=256)
    (problem,) = loop_problems(fn, *args)
    target = get_target("cuda:sm_100a")
    template = get_template(f"triton.{problem.kind}")
    pdl = triton_pdl_refusal(target) is None
    params = template.space.complete({"PDL": pdl} if pdl else {})
    r = template.render(problem, params, target)
    (res,) = compile_jobs([CompileJob(f"fused_quant_{case}", r.source, r.aot.to_json(), target.triton)], tmp_path)
    assert res.ok, res.error[-2000:]
    ptx = (tmp_path / res.artifacts["ptx"]).read_text()
    assert "div.rn.f32" in ptx
    if case == "norm":  # (the SwiGLU's sigmoid is 1 / (1 + exp(-x)), its own rounding, stored alike)
        assert "div.full.f32" not in ptx
    assert "e4m3" in ptx  # the fp8 conversion of the stored scales
    if pdl:
        assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx


def test_dynamic_token_count_keeps_four_launches_and_the_bits():
    """A decode server's token count varies: under ``dynamic=True`` the layer is still 4
    launches and bit-identical to eager at every size, ragged ones included."""
    from test_nvfp4 import QuantisedDecoderMLP

    torch.manual_seed(0)
    m = QuantisedDecoderMLP()
    quantize_linears(m)
    with torch.no_grad():
        x = torch.randn(5, 64)
        h = m.norm(x)
        m.gate_up.calibrate(h)
        g, u = m.gate_up(h).chunk(2, -1)
        m.down.calibrate(F.silu(g) * u)
        compiled = torch.compile(m, backend="tilewright", dynamic=True)
        with tilewright.config.patch(force_backend="auto"), collect_reports() as reports:
            for n in (5, 7, 33):
                x = torch.randn(n, 64)
                assert torch.equal(compiled(x), m(x)), n
    (report,) = reports
    assert report.launches == 4 and report.extern_ops == 0, report.kernel_counts
