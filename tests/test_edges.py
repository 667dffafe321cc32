"""Regression tests for the edges of issue 27 (each named after what it guards): NaN through
libm compositions, round half to even, round(decimals=...) and angle lowered, in each emitter
that runs here (the Triton interpreter, C++; SYCL and Metal in ``test_special_values.py``)."""

from __future__ import annotations

import pytest
import torch

import tilewright
from tilewright.compiler.report import collect_reports

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
FAST = dict(strict=True, bench_rep=1, bench_min_rep=1, bench_warmup=0, bench_budget_ms=0.0)


def _emitters() -> list:
    from tilewright.runtime import cpp

    return ["triton", pytest.param("cpp", marks=pytest.mark.skipif(not cpp.available(), reason="no C++ compiler"))]


def compiled_on(mode: str, fn, *args, kernels: int = 1):
    """``fn(*args)`` compiled with ``mode`` forced; asserts that ``kernels`` generated loop
    kernels ran, each in ``mode``'s language, and nothing fell back to ATen."""
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend=mode, **FAST), collect_reports() as reports:
        out = torch.compile(fn, backend="tilewright", dynamic=False)(*args)
    assert reports and all(r.fallback is None for r in reports)
    assert sum(r.loop_kernels for r in reports) == kernels, [k.op for r in reports for k in r.kernels]
    for r in reports:
        assert all(k.winner.startswith(f"{mode}.") for k in r.kernels), [(k.op, k.winner, k.reason) for k in r.kernels]
        assert r.extern_ops == 0, f"{r.extern_ops} ATen ops left in the graph"
    return out


def same_values(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit as values: NaN where NaN, the same infinities, zeros of the same sign."""
    nan = want.isnan()
    return (got.dtype == want.dtype and got.shape == want.shape and torch.equal(got.isnan(), nan)
            and torch.equal(got.nan_to_num(), want.nan_to_num())
            and torch.equal(got.signbit() & ~nan, want.signbit() & ~nan))


def _specials(n: int = 64) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 3
    x[:8] = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-42, -1e-42])
    return x


@pytest.mark.parametrize("mode", _emitters())
def test_sin_of_atan_keeps_nan(mode):
    # g++ rewrites sinf(atanf(x)) as x / sqrt(x*x + 1), else copysign(1, x), unless the libm
    # calls are no builtins: +-1 for a NaN input
    x = _specials()
    fn = lambda x: torch.sin(torch.atan(x))  # noqa: E731
    got = compiled_on(mode, fn, x)
    want = fn(x)
    assert torch.equal(got.isnan(), want.isnan()), (got[:8], want[:8])
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("mode", _emitters())
def test_round_is_half_to_even_where_x_plus_half_rounds(mode):
    x = torch.tensor([8388609.0, -8388609.0, 8388607.5, 0.5, 1.5, 2.5, -0.5, -2.5, -0.3, 16777215.0,
                      float("inf"), -float("inf"), float("nan"), 4194303.5, 0.49999997])
    got = compiled_on(mode, lambda x: torch.round(x) * 1, x)
    assert same_values(got, torch.round(x)), (got, torch.round(x))


@pytest.mark.parametrize("mode", _emitters())
@pytest.mark.parametrize("decimals", [2, 0, -1])
def test_round_with_decimals_is_lowered(mode, decimals):
    x = torch.randn(7, 13, generator=torch.Generator().manual_seed(decimals + 5)) * 300
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 1.125])
    fn = lambda x: torch.round(x, decimals=decimals) + 1  # noqa: E731
    for dt in (torch.float32, torch.bfloat16):
        got = compiled_on(mode, fn, x.to(dt))
        assert same_values(got, fn(x.to(dt))), dt


@pytest.mark.parametrize("mode", _emitters())
def test_angle_is_lowered(mode):
    x = _specials()
    fn = lambda x: torch.angle(x) * 2  # noqa: E731
    got = compiled_on(mode, fn, x)
    assert same_values(got, fn(x))
    i = torch.randint(-5, 5, (7, 13), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    got = compiled_on(mode, torch.angle, i)
    assert same_values(got, torch.angle(i))


# -- what a new user's trial met ---------------------------------------------------------------------
def test_a_misspelt_setting_raises_naming_the_closest():
    with pytest.raises(AttributeError, match=r"'grpah_race' \(did you mean 'graph_race'\?\)"):
        tilewright.config.grpah_race = "off"
    assert not hasattr(tilewright.config, "grpah_race")
    old = tilewright.config.graph_race
    tilewright.config.graph_race = old  # a real setting still takes a value


def test_a_template_whose_supports_raises_is_refused_with_one_warning(monkeypatch):
    from tilewright.problem import GemmProblem
    from tilewright.runtime.targets import get_target
    from tilewright.templates import get_template
    from tilewright.templates import base

    t = get_template("triton.gemm")
    monkeypatch.setattr(type(t), "problem_support", lambda self, problem, target: 1 / 0)
    monkeypatch.setattr(base, "_raised_warned", set())
    problem = GemmProblem(M=24, N=40, K=48, dtype="fp16", out_dtype="fp16")
    with pytest.warns(RuntimeWarning, match=r"'triton.gemm' raised in supports\(\) \(ZeroDivisionError"):
        why = t.supports(problem, get_target("cpu"))
    assert not why and "ZeroDivisionError" in why.reason
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per template and error
        assert not t.supports(problem, get_target("cpu"))


def test_an_overriding_supports_that_raises_is_refused_too(monkeypatch):
    from tilewright.problem import GemmProblem
    from tilewright.runtime.targets import get_target
    from tilewright.templates import base, get_template

    monkeypatch.setattr(base, "_raised_warned", set())
    parent = type(get_template("triton.gemm"))

    class Mine(parent):
        id = "mine.gemm_test"

        def supports(self, problem, target):
            raise KeyError("oops")

    with pytest.warns(RuntimeWarning, match="'mine.gemm_test' raised"):
        assert not Mine().supports(GemmProblem(M=8, N=8, K=8, dtype="fp16", out_dtype="fp16"), get_target("cpu"))


# -- scatter races -------------------------------------------------------------------------------------
def test_fusion_refuses_a_kernel_that_reads_the_buffer_it_scatters_into():
    from tilewright.kinds.loop.fusion.build import FusionError, _refuse_reads_of_scatter_targets
    from tilewright.ir import expr as E
    from tilewright.ir.index import var

    x0 = var("x", 0)
    idx = E.load("x_idx", (x0,), "i64")
    gathered = E.load("y", (E.indirect_symbol(0),), "fp32", indirect=(idx,))  # y[x], read through the indices
    value = gathered + gathered
    with pytest.raises(FusionError, match="scatters into y and reads it"):
        _refuse_reads_of_scatter_targets([("out", (E.indirect_symbol(0),), value, ((idx,), None, "y"))])
    # the same scatter reading another buffer is fine
    other = E.load("y_old", (E.indirect_symbol(0),), "fp32", indirect=(idx,))
    _refuse_reads_of_scatter_targets([("out", (E.indirect_symbol(0),), other + other, ((idx,), None, "y"))])


@pytest.mark.parametrize("mode", _emitters())
def test_a_repeated_index_reads_the_old_values_in_y_x_plus_equals_y_x(mode):
    def fn(y, x):
        y[x] += y[x]
        return y * 1

    y0 = torch.randn(50, generator=torch.Generator().manual_seed(0))
    x = torch.randint(0, 50, (3000,), generator=torch.Generator().manual_seed(1))  # every index many times
    y = y0.clone()
    torch._dynamo.reset()
    # unchecked: the answer must come from the kernels themselves, not from the tuner's check
    with tilewright.config.patch(force_backend=mode, check_candidates=False, **FAST):
        out = torch.compile(fn, backend="tilewright", dynamic=False)(y, x)
    ref = fn(y0.clone(), x)
    assert torch.equal(out, ref) and torch.equal(y, ref)


# -- tilewright aot: a candidate that spills or crashes costs itself ----------------------------------
class _MatMul(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(96, 80))

    def forward(self, x):
        return x @ self.w


def edges_aot_model():
    """x (64x96) @ w (96x80) in fp32: Triton's first-ranked 16x32x128 tile with one warp and
    three stages spilled on sm_90a (255 registers, 2804 B spill stores; measured)."""
    return _MatMul(), (torch.randn(64, 96),)


@pytest.fixture
def fake_compiles(monkeypatch):
    """``aot.build`` without compilers: every kernel planned first spills (its ptxas report
    says so), Helion's kernels crash their worker, everything else builds clean."""
    import types

    from tilewright.compiler import aot
    from tilewright.runtime.aot import CompileResult
    from tilewright.runtime.resources import Resources
    from tilewright.runtime.verify import VerifyResult

    first: set[str] = set()

    def compile_jobs(jobs, root, workers=2, timeout_s=600.0, on_result=None):
        jobs = list(jobs)
        if not first:
            first.update(j.name for j in jobs)
        out = [CompileResult(j.name, "k", "crashed" if "helion" in j.name else "built",
                             artifacts={} if "helion" in j.name else {"source": j.name},
                             error="worker exited with code 1" if "helion" in j.name else "") for j in jobs]
        for r in out:
            if on_result:
                on_result(r)
        return out

    def resources(artifacts):
        name = str(artifacts["source"])
        return Resources(registers=255, spill_stores=2804, spill_loads=2748, stack=1536) if any(
            name.endswith(f) for f in first) else Resources(registers=128)

    monkeypatch.setattr(aot, "compile_jobs", compile_jobs)
    monkeypatch.setattr(aot, "read_resources", resources)
    monkeypatch.setattr(aot, "verify", lambda artifacts, checks: VerifyResult((), {}))
    monkeypatch.setitem(__import__("sys").modules, "edges_aot_models",
                        types.SimpleNamespace(edges_aot_model=edges_aot_model))
    return first


def test_aot_keeps_the_next_candidate_that_does_not_spill(fake_compiles, tmp_path):
    from tilewright.compiler import aot

    report = aot.build("edges_aot_models:edges_aot_model", ["sm_90a"], tmp_path, workers=1)
    assert report.ok, [(k.name, k.dropped, k.verify_failures) for k in report.kernels]
    spilled = [k for k in report.kernels if k.name in fake_compiles and "helion" not in k.name]
    assert spilled and all(k.dropped and "spills registers" in k.dropped for k in spilled)
    for k in spilled:
        # the same template's next-ranked setting replaced it, built and checked
        mine = [o for o in report.kernels if o.template.id == k.template.id and o.good]
        assert mine and all(o.params != k.params for o in mine), k.name
        assert f"replaced by {k.template.id} " in k.dropped
    crashed = [k for k in report.kernels if "helion" in k.name]
    assert crashed and all(k.dropped and k.dropped.startswith("crashed") for k in crashed)
    manifest = __import__("json").loads((tmp_path / "manifest.json").read_text())
    assert manifest["summary"]["dropped"] == len(report.dropped) and manifest["summary"]["spilling"] == 0


def test_aot_cli_says_what_it_replaced_and_exits_0(fake_compiles, tmp_path, capsys):
    from tilewright.cli.main import main

    rc = main(["aot", "edges_aot_models:edges_aot_model", "--target", "sm_90a", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    assert "left out (spills registers" in out.replace("\n", "")
    assert "failed candidates replaced" in out.replace("\n", " ")


def test_aot_describes_a_loop_kernel_without_warps():
    from tilewright.compiler.aot import describe_params

    # a Helion softmax on FlyDSL (gfx950) has no num_warps: the table raised KeyError
    assert describe_params({"XBLOCK": 1, "RBLOCK": 128}) == "x1 r128"
    assert describe_params({"XBLOCK": 4, "PERSISTENT": True, "num_warps": 8}) == "x4 r-row w8"


# -- negative strides and the ATen forms ----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["auto", "triton"])
def test_index_put_then_add_of_its_flip(mode):
    # the torch form read x.flip(0) as as_strided(..., stride -1): "Negative strides are not supported"
    def fn(x, i, v):
        x = x.clone()
        x.index_put_((i,), v)
        x.add_(x.flip(0))
        return x

    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(3))
    i, v = torch.tensor([0, 4]), torch.randn(2, 5, generator=torch.Generator().manual_seed(4))
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend=mode, **FAST):
        out = torch.compile(fn, backend="tilewright", dynamic=False)(x, i, v)
    assert torch.allclose(out, fn(x, i, v), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["auto", "triton"])
def test_cumprod_backward_at_zeros(mode):
    # its backward flips (negative strides in the torch form), takes argmax() of a boolean
    # (torch refuses) and gathers at each row's argmax (a row load the Triton emitter masked by
    # the r mask: a pointer of [1, 1] against a mask of [1, RBLOCK])
    def fn(x):
        return (torch.cumprod(x, 0) * torch.arange(1.0, 8.0)).sum()

    x0 = torch.randn(7, generator=torch.Generator().manual_seed(5))
    x0[2] = 0.0
    x = x0.clone().requires_grad_()
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend=mode, **FAST):
        torch.compile(fn, backend="tilewright", dynamic=False)(x).backward()
    ref = x0.double().requires_grad_()
    fn(ref).backward()
    assert torch.allclose(x.grad.double(), ref.grad, rtol=1e-5, atol=1e-6), (x.grad, ref.grad)


def test_the_torch_form_reads_a_flipped_view_without_negative_strides():
    from test_loop_kernels import loop_problems

    from tilewright.autotune.candidates import Candidate
    from tilewright.compiler.kernel_factory import TemplateKernelFactory
    from tilewright.kinds.loop import make_loop_inputs
    from tilewright.runtime.targets import get_target
    from tilewright.templates import get_template

    a = torch.randn(5, 9, generator=torch.Generator().manual_seed(6))
    (problem,) = loop_problems(lambda a: a + a.flip(1) * 2, a)
    t = get_template("aten.pointwise")
    launch = TemplateKernelFactory().build(problem, Candidate.of(t.id, t.source_hash), get_target("cpu"))
    x = make_loop_inputs(problem, "cpu", 0)
    got = launch(*x.tensors, *x.sizes)
    out = got[0] if isinstance(got, tuple) else got
    src = x.tensors[0]
    assert torch.allclose(out.reshape(src.shape), src + src.flip(1) * 2)


@pytest.mark.parametrize("shape", [(0, 2, 8, 16), (2, 2, 0, 16)], ids=["batch0", "seq0"])
def test_sdpa_of_an_empty_batch_or_sequence_under_forced_triton(shape):
    # a row value stored along an empty row was masked by xmask alone: lane 0 wrote into a
    # buffer of no elements and the process died (exit 139)
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(*shape, generator=gen) for _ in range(3))
    fn = torch.nn.functional.scaled_dot_product_attention
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend="triton", **FAST):
        out = torch.compile(lambda q, k, v: fn(q, k, v), backend="tilewright", dynamic=False)(q, k, v)
    assert out.shape == fn(q, k, v).shape


def test_padding_mask_sdpa_backward_under_forced_triton():
    # the backward's reference raised "invalid index of a 0-dim tensor": the score_mod's
    # derivative is the constant 1, and the reference indexed it like a score
    F = torch.nn.functional
    gen = torch.Generator().manual_seed(8)
    q0, k0, v0 = (torch.randn(2, 2, 8, 16, generator=gen) for _ in range(3))
    mask = (torch.arange(8)[None, :] < torch.tensor([8, 5])[:, None])[:, None, None, :]
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend="triton", **FAST):
        out = torch.compile(fn, backend="tilewright", dynamic=False)(q, k, v, mask)
        out.sum().backward()
    rq, rk, rv = (t.double().requires_grad_() for t in (q0, k0, v0))
    fn(rq, rk, rv, mask).sum().backward()
    for got, want in ((q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad)):
        assert ((got.double() - want).norm() / want.norm()).item() < 2e-5
