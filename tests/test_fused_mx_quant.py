"""MX activation quantisation fused into its producer's loop kernel
(kinds/loop/lower/quantize_mx.py): the fused kernel writes the same bytes and E8M0 scales as the
unfused quantiser (tilewright/quant/mx.py), in every emitter that runs it, and a quantised
decoder layer launches 4 kernels."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_loop_kernels import FACTORY, loop_problems

import tilewright
import tilewright.kernels.mx  # noqa: F401 - registers torch.ops.tilewright.mx_quantize
from tilewright.autotune.kinds import make_loop_inputs, poisoned_loop_outputs
from tilewright.kinds.loop.lower.quantize_mx import floor_log2, pow2
from tilewright.compiler.report import collect_reports
from tilewright.ir import expr as E
from tilewright.quant import mx
from tilewright.quant.linear import quantize_linears
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

Q = torch.ops.tilewright.mx_quantize


def _norm_quant(x, w, fmt):
    h = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
    q, s = Q(h.reshape(-1, h.shape[-1]), fmt)
    return h, q, s


def _swiglu_quant(gate_up, fmt):
    g, u = gate_up.chunk(2, dim=-1)
    h = F.silu(g) * u
    q, s = Q(h.reshape(-1, h.shape[-1]), fmt)
    return h, q, s


def _add_quant(x, r, fmt):
    h = x + r
    q, s = Q(h, fmt)
    return h, q, s


def _special(x: torch.Tensor) -> torch.Tensor:
    """Rows of 32-element blocks that test the rules: E2M1 and E4M3 ties at a scale of 1, -0,
    a zero block, fp32 subnormals only, values near fp32's largest, a NaN, an infinity."""
    x = x.clone()
    x[0, :16] = torch.tensor([6.0, 5.0, 2.5, 0.75, 1.25, 1.75, 3.5, 0.25, -2.5, -0.0, 0.0, 1.0, -6.0, 4.0, 3.0, 0.5])
    x[1, :8] = torch.tensor([448.0, 1.0625, 1.1875, -0.0, 0.0078125 * 1.5, 2.0 ** -9 * 0.5, 464.0, -300.0])
    x[2, :32] = 0.0
    x[3, :32] = torch.linspace(-1e-40, 1e-40, 32)
    x[4, :32] = x[4, :32].sign() * 3e38
    x[5, 40] = float("nan")
    x[6, 70] = float("-inf")
    return x


def _inputs(case, dtype, fmt, rows=24, K=96):
    g = torch.Generator().manual_seed(7)
    if case == "norm":
        x = torch.randn(rows, K, generator=g).to(dtype)
        return _norm_quant, (x, torch.randn(K, generator=g).to(dtype), fmt)
    if case == "swiglu":
        return _swiglu_quant, (torch.randn(rows, 2 * K, generator=g).to(dtype), fmt)
    # a residual add of a transposed (non-contiguous) operand, zero where the specials are
    x = _special(torch.randn(rows, K, generator=g) * 4).to(dtype)
    r = torch.randn(K, rows, generator=g).t()
    r[:7] = 0.0
    return _add_quant, (x, r.to(dtype), fmt)


def _assert_same_quantisation(h, q, s, fmt):
    ref = mx.quantize(h.reshape(-1, h.shape[-1]), fmt)
    assert s.dtype == torch.float8_e8m0fnu
    assert torch.equal(s.view(torch.uint8), ref.scale.view(torch.uint8)), "E8M0 scales differ"
    same = torch.equal(q, ref.data) if fmt == "mxfp4" else torch.equal(q.view(torch.uint8), ref.data.view(torch.uint8))
    assert same, "values differ"


@pytest.mark.parametrize("case,dtype,fmt", [
    ("norm", torch.float32, "mxfp4"), ("norm", torch.bfloat16, "mxfp8"),
    ("swiglu", torch.bfloat16, "mxfp4"), ("add", torch.float32, "mxfp4"), ("add", torch.bfloat16, "mxfp8"),
    ("add", torch.float32, "mxfp8"),
])
def test_fused_mx_quantisation_is_bit_exact(case, dtype, fmt):
    """One kernel computes the producer and its MX quantisation; its bytes and E8M0 scales are
    the unfused quantiser's on the producer's own stored output (NaN and infinite blocks, zero
    and subnormal blocks, saturation and ties included in the ``add`` case)."""
    fn, args = _inputs(case, dtype, fmt)
    with tilewright.config.patch(force_backend="auto"), collect_reports() as reports:
        h, q, s = torch.compile(fn, backend="tilewright", dynamic=False)(*args)
    _assert_same_quantisation(h, q, s, fmt)
    (report,) = reports
    assert report.launches == 1 and report.loop_kernels == 1, report.kernel_counts


def test_exponent_ladders_are_exact():
    """floor_log2 and pow2, evaluated by the torch emitter's op meanings over every fp32
    binade (subnormals included), equal frexp's exponent and ldexp's power."""
    from tilewright.ir.ops import OPS

    def run(root, env):
        seen = {}
        for node in E.toposort([root]):
            if node.op == "const":
                seen[node] = torch.tensor(node.arg, dtype=torch.float32 if node.dtype == "fp32" else torch.int32)
            else:
                seen[node] = env if node.op == "load" else OPS[node.op].torch(*(seen[s] for s in node.src))
        return seen[root]

    a = torch.cat([torch.ldexp(torch.tensor(1.0), torch.arange(-149, 128).float()),
                   torch.ldexp(torch.tensor(1.9999999), torch.arange(-126, 128).float()),
                   torch.tensor([1e-45, 3e-39, 3.4e38])])
    leaf = E.Node("load", "fp32", (), ("a", (0,), False))
    _, e = torch.frexp(a)
    assert torch.equal(run(floor_log2(leaf), a), e.int() - 1)
    n = torch.arange(-125, 128, dtype=torch.int32)
    p = run(pow2(E.Node("load", "i32", (), ("n", (0,), False))), n)
    assert torch.equal(p, torch.pow(2.0, n.float()))


def _fp32_values(problem):
    """The problem with its E4M3 value buffer stored as fp32: the values are E4M3-exact already
    (the rounding is IR arithmetic); the Triton interpreter and the C++ emitter take no fp8."""
    k = problem.kernel
    outs = tuple(dataclasses.replace(b, dtype="fp32") if b.dtype == "fp8e4m3" else b for b in k.outputs)
    return dataclasses.replace(problem, kernel=dataclasses.replace(k, outputs=outs))


@pytest.mark.parametrize("emitter,params,fmt", [
    ("triton", dict(XBLOCK=2, PERSISTENT=True), "mxfp4"),
    ("triton", dict(XBLOCK=1, PERSISTENT=False, RBLOCK=32), "mxfp8"),
    ("cpp", {}, "mxfp8"),
])
def test_emitters_render_the_fused_norm_mx_quantisation(emitter, params, fmt):
    fn, args = _inputs("norm", torch.float32, fmt, rows=5, K=64)
    (problem,) = loop_problems(fn, *args)
    assert problem.kind == "reduction" and len(problem.kernel.outputs) == 3
    assert problem.kernel.outputs[2].dtype == "u8"  # the E8M0 scale bytes
    problem = _fp32_values(problem)
    cpu = get_target("cpu")
    template = get_template(f"{emitter}.reduction")
    if not template.supports(problem, cpu):
        pytest.skip(template.supports(problem, cpu).reason)
    launch = FACTORY.compile(template.render(problem, template.space.complete(params), cpu))
    x = make_loop_inputs(problem, "cpu", seed=3)
    h, q, s = launch(*x.tensors, *x.sizes, outs=poisoned_loop_outputs(problem, "cpu"))
    ref = mx.quantize(h, fmt)
    assert torch.equal(s, ref.scale.view(torch.uint8))
    assert torch.equal(q, ref.data if fmt == "mxfp4" else ref.data.float())


def test_unfusable_mx_quantisation_stays_the_op():
    """K not a multiple of 32 raises as eager does; with fusion off the op is its own launch
    and the same bytes."""
    with pytest.raises(Exception, match="multiple of 32"):
        torch.compile(lambda t: Q(t, "mxfp4")[0], backend="tilewright")(torch.randn(4, 40))
    x = torch.randn(8, 64)
    with tilewright.config.patch(fuse_quantisation=False), collect_reports() as reports:
        q, s = torch.compile(lambda t: Q(t * 2, "mxfp8"), backend="tilewright")(x)
    ref = mx.quantize(x * 2, "mxfp8")
    assert s.dtype == torch.float8_e8m0fnu and torch.equal(s.view(torch.uint8), ref.scale.view(torch.uint8))
    assert torch.equal(q.view(torch.uint8), ref.data.view(torch.uint8))
    (report,) = reports
    assert report.extern_ops == 1 and report.loop_kernels == 1  # x * 2, then the op


class DecoderMLP(nn.Module):
    """RMSNorm -> gate_up -> SwiGLU -> down, plus the residual (attention aside)."""

    def __init__(self, H=64, inter=128):
        super().__init__()
        self.norm = nn.RMSNorm(H, eps=1e-6)
        self.gate_up, self.down = nn.Linear(H, 2 * inter, bias=False), nn.Linear(inter, H, bias=False)

    def forward(self, x):
        g, u = self.gate_up(self.norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_mx_decoder_layers_launch_four_kernels_each(fmt):
    """Each MX activation quantisation is written by its producer's kernel: per layer one
    norm+quantise kernel, the gate_up GEMM, one SwiGLU+quantise kernel and the down GEMM, no
    ATen call, bit-identical to eager, also for dynamic token counts; unfused it is 6."""
    torch.manual_seed(0)
    layers = 2
    m = nn.Sequential(*(DecoderMLP() for _ in range(layers)))
    assert quantize_linears(m, fmt=fmt) == 2 * layers
    with torch.no_grad():
        compiled = torch.compile(m, backend="tilewright", dynamic=True)
        with tilewright.config.patch(force_backend="auto"), collect_reports() as reports:
            for n in (8, 5, 33):
                x = torch.randn(n, 64)
                assert torch.equal(compiled(x), m(x)), n
        report = reports[-1]
        assert report.launches <= 4 * layers, (report.kernel_counts, report.extern_ops)
        assert report.gemm_nodes == 2 * layers and report.extern_ops == 0
        torch._dynamo.reset()
        x = torch.randn(2, 8, 64)
        with tilewright.config.patch(force_backend="auto", fuse_quantisation=False), \
                collect_reports() as reports:
            assert torch.equal(torch.compile(m, backend="tilewright")(x), m(x))
        assert reports[0].launches == 6 * layers, (reports[0].kernel_counts, reports[0].extern_ops)


@pytest.mark.slow
@pytest.mark.parametrize("case,fmt", [("norm", "mxfp8"), ("swiglu", "mxfp4")])
def test_fused_mx_kernel_builds_for_blackwell(case, fmt, tmp_path):
    """``tilewright aot``'s build of the fused kernel for sm_100a (the block-scaled GEMM's
    chip): the exponent ladders and bit tests compile, the scales are stored as bytes and the
    MXFP8 values as E4M3, and with PDL the kernel waits and releases."""
    from tilewright.runtime.aot import CompileJob, compile_jobs
    from tilewright.runtime.pdl import triton_pdl_refusal

    fn, args = _inputs(case, torch.bfloat16, fmt, rows=8, K=256)
    (problem,) = loop_problems(fn, *args)
    target = get_target("cuda:sm_100a")
    template = get_template(f"triton.{problem.kind}")
    pdl = triton_pdl_refusal(target) is None
    r = template.render(problem, template.space.complete({"PDL": pdl} if pdl else {}), target)
    (res,) = compile_jobs([CompileJob(f"fused_mx_{case}", r.source, r.aot.to_json(), target.triton)], tmp_path)
    assert res.ok, res.error[-2000:]
    ptx = (tmp_path / res.artifacts["ptx"]).read_text()
    assert "st.global.u8" in ptx or "st.global.b8" in ptx  # the E8M0 scale bytes
    if fmt == "mxfp8":
        assert "e4m3" in ptx
    if pdl:
        assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case,fmt", [("norm", "mxfp4"), ("add", "mxfp8"), ("add", "mxfp4")])
def test_gpu_fused_mx_quantisation_is_bit_exact(case, fmt):
    """On the GPU the fused kernel is Triton's: the same bytes and E8M0 scales as the
    quantiser's torch ops on the producer's stored output (subnormal, NaN and infinite blocks
    in the ``add`` case: a flushed subnormal or an inexact power of two would show here)."""
    fn, args = _inputs(case, torch.bfloat16, fmt, rows=33, K=256)
    args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        h, q, s = torch.compile(fn, backend="tilewright", dynamic=False)(*args)
    _assert_same_quantisation(h, q, s, fmt)
    (report,) = reports
    assert report.loop_kernels == 1 and report.extern_ops == 0
    assert all(k.winner.startswith("triton.") for k in report.kernels), [k.winner for k in report.kernels]
