"""The correctness suite's GPU part: generated kernels against float64 on the device, isolated
tuning with real compiles and injected faults, device-event timing, the backend end to end, and
a warmed cache that re-benchmarks nothing. Skipped without CUDA; bench/device_check.sh runs it."""

from __future__ import annotations

import psutil
import pytest
import torch
import torch.nn as nn
from conftest import rel_err
from fakes import Behaviour, FakeFactory, FakePolicy

import tilewright
from tilewright.autotune import select as select_mod
from tilewright.autotune.bench import time_callable
from tilewright.autotune.cache import TuningCache
from tilewright.autotune.inputs import make_inputs, poisoned_output, rel_error, tolerance
from tilewright.autotune.policy import policy_for
from tilewright.autotune.select import select_gemm
from tilewright.compiler.report import collect_reports
from tilewright.compiler.kernel_factory import default_factory
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem
from tilewright.runtime.targets import detect_target

pytestmark = pytest.mark.gpu


@pytest.fixture
def target():
    return detect_target(torch.device("cuda"))


def no_workers_left() -> bool:
    kids = [p for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())]
    return not kids


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("mnk", [(1, 4096, 4096), (127, 257, 509), (512, 1024, 256)])
def test_generated_kernels_match_float64_on_the_gpu(target, dtype, mnk):
    M, N, K = mnk
    p = GemmProblem(M=M, N=N, K=K, dtype=dtype, layout_b="col",
                    epilogue=(EpilogueOp("add", input=0), EpilogueOp("silu")),
                    epilogue_inputs=(EpilogueInput("N", dtype),))
    x = make_inputs(p, "cuda")
    ref = default_factory.reference(p, x)
    for cand in policy_for("gemm", target).candidates(p, target)[1:3]:
        out = poisoned_output(p, "cuda")
        default_factory.build(p, cand, target)(x.a, x.b, *x.epilogue_inputs, out=out)
        assert rel_error(out, ref) <= tolerance(p), cand.name


def test_dynamic_problem_runs_any_size_in_its_bucket(target):
    p = GemmProblem(M=64, N=384, K=512, dtype="bf16", layout_b="col", dynamic=frozenset({"M"}))
    cand = policy_for("gemm", target).candidates(p, target)[1]
    launch = default_factory.build(p, cand, target)
    for M in (33, 50, 64):
        q = p.with_sizes(M=M)
        x = make_inputs(q, "cuda")
        out = launch(x.a, x.b, out=poisoned_output(q, "cuda"))
        assert rel_error(out, default_factory.reference(q, x)) <= tolerance(q)


def test_isolated_tuning_with_real_compiles(target, tmp_path):
    assert tilewright.config.isolate == "auto"  # auto means workers on a GPU
    p = GemmProblem(M=256, N=512, K=1024, dtype="bf16", layout_b="col")
    sel = select_gemm(p, target, default_factory, cache=TuningCache(tmp_path / "t.json"))
    report = [(r.candidate.name, r.record.status, r.record.reason) for r in sel.results]
    ok = [r for r in sel.results if r.record.status == "ok"]
    assert sel.measured and sel.winner_record.status == "ok", report
    assert any(r.candidate.backend == "triton" for r in ok), report
    assert sel.winner_record.rel_err <= tolerance(p)
    assert no_workers_left()


def test_faults_next_to_a_cuda_context(target, tmp_path, monkeypatch):
    names = ["aten", "segv", "oom", "good"]  # each fault costs a worker restart: keep it short
    monkeypatch.setattr(select_mod, "policy_for", lambda op, t: FakePolicy(names))
    factory = FakeFactory({"aten": Behaviour("good", 5.0), "segv": Behaviour("segfault"),
                           "oom": Behaviour("oom"), "good": Behaviour("good", 1.0)})
    sel = select_gemm(GemmProblem(M=64, N=64, K=64, dtype="fp32"), target, factory,
                      cache=TuningCache(tmp_path / "t.json"))
    assert sel.winner.param_dict["name"] == "good"
    status = {r.candidate.param_dict.get("name", "aten"): r.record.status for r in sel.results}
    assert status == {"aten": "ok", "segv": "failed", "oom": "failed", "good": "ok"}
    assert no_workers_left()


def test_device_event_timing_with_rotation():
    a = [torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    t = time_callable([lambda x=x: x @ x for x in a], torch.device("cuda"), warmup=3, rep=50,
                      budget_ms=500, min_rep=5, stable_pct=1.0)
    assert t.median_ms > 0 and 5 <= t.reps <= 50 and t.spread_ms >= 0


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(512, 1024), nn.Linear(1024, 512)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


@pytest.mark.parametrize("mode", ["auto", "triton"])
def test_backend_on_the_gpu(mode, fresh_cache):
    m = MLP().cuda().to(torch.bfloat16)
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad(), tilewright.config.patch(force_backend=mode), collect_reports() as reports:
        out = torch.compile(m, backend="tilewright")(x)
    assert rel_err(out, m.float()(x.float())) < 2e-2
    winners = [g.winner for r in reports for g in r.gemms]
    assert winners and (mode == "auto" or all(w.startswith("triton.") for w in winners))
    assert no_workers_left()


def test_warmed_model_rebenchmarks_nothing_on_the_gpu(fresh_cache):
    from tilewright.autotune.shapes import NamedProblem
    from tilewright.autotune.warm import warm
    from tilewright.compiler.capture import ModelSpec, capture_gemms

    m = MLP().cuda().to(torch.bfloat16)
    x = torch.randn(32, 512, device="cuda", dtype=torch.bfloat16)
    problems = [c.problem for c in capture_gemms(ModelSpec(m, (x,)))]
    target = detect_target(torch.device("cuda"))
    report = warm([NamedProblem(str(i), p) for i, p in enumerate(problems)], target, default_factory)
    assert report.tuned == len(problems) == 2
    with torch.no_grad(), collect_reports() as reports:
        torch.compile(m, backend="tilewright")(x)
    cands = [c for r in reports for g in r.gemms for c in g.candidates]
    assert cands and all(c.cached for c in cands)


# -- the templates added for NVFP4, decode shapes, TMA and CuTeDSL ------------------------------
def _check_candidate(p, cand, target):
    x = make_inputs(p, "cuda")
    ref = default_factory.reference(p, x)
    out = poisoned_output(p, "cuda")
    default_factory.build(p, cand, target)(x.a, x.b, *x.epilogue_inputs, out=out, **x.scale_kwargs)
    assert rel_error(out, ref) <= tolerance(p), cand.name


@pytest.mark.parametrize("M", [1, 16, 64, 257])
def test_every_policy_candidate_is_right_on_the_gpu(target, M):
    """Decode (swap-AB, split-K, thin tiles), TMA and, where installed, CuTeDSL candidates."""
    p = GemmProblem(M=M, N=4096, K=4096, dtype="bf16", layout_b="col",
                    epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu")),
                    epilogue_inputs=(EpilogueInput("N", "bf16"),))
    cands = policy_for("gemm", target).candidates(p, target)[1:]
    if M <= 16:
        assert any(c.param_dict.get("SWAP_AB") for c in cands)
    for cand in cands:
        _check_candidate(p, cand, target)


@pytest.mark.parametrize("M", [1, 8, 128])
def test_nvfp4_gemm_on_the_gpu(target, M):
    p = GemmProblem(M=M, N=1024, K=2048, dtype="nvfp4", out_dtype="bf16", layout_b="col",
                    scale_layout="row",
                    epilogue=(EpilogueOp("mul", input=0), EpilogueOp("mul", input=1)),
                    epilogue_inputs=(EpilogueInput("", "fp32"), EpilogueInput("", "fp32")))
    for cand in policy_for("gemm", target).candidates(p, target)[1:]:
        _check_candidate(p, cand, target)


def test_fp8_scaled_mm_on_the_gpu(target):
    if not target.has("fp8_e4m3"):
        pytest.skip(f"{target.name} has no OCP fp8")
    x = torch.randn(64, 512, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(256, 512, device="cuda").to(torch.float8_e4m3fn)
    sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(2.0, device="cuda")

    def f(x, w):
        return torch._scaled_mm(x, w.t(), sa, sb, out_dtype=torch.bfloat16)

    with tilewright.config.patch(force_backend="triton"):
        out = torch.compile(f, backend="tilewright")(x, w)
    assert rel_err(out, x.double() @ w.double().t()) < 2e-2


class _Block(nn.Module):
    """RMSNorm → gated MLP → residual, and a softmax: the loop kernels a decoder needs."""

    def __init__(self, d: int = 256):
        super().__init__()
        self.norm = nn.RMSNorm(d)
        self.gate, self.up, self.down = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False), \
            nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        y = x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))
        return torch.softmax(y @ y.transpose(-1, -2) / 16.0, -1) @ y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loop_kernels_on_the_gpu_forward_and_backward(fresh_cache, dtype):
    """Generated pointwise/reduction kernels (compiled Triton, not the interpreter) against
    eager in float64, gradients included; every loop kernel must have run on Triton."""
    m = _Block().cuda().to(dtype)
    ref_m = _Block().cuda().double()
    ref_m.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
    x = torch.randn(4, 33, 256, device="cuda", dtype=dtype, requires_grad=True)
    xr = x.detach().double().requires_grad_()
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(m, backend="tilewright")(x)
        out.float().square().sum().backward()
    ref = ref_m(xr)
    ref.square().sum().backward()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert rel_err(out, ref) < tol and rel_err(x.grad, xr.grad) < tol
    kernels = [k for r in reports for k in r.kernels]
    assert kernels and all(k.winner.startswith("triton.") for k in kernels), [k.winner for k in kernels]
    assert no_workers_left()


def test_compiled_grouped_gemm_is_chosen_in_select_on_the_gpu(fresh_cache):
    """A compiled MoE-style grouped GEMM (forward, and both gradients: a 2d3d and a 2d2d call)
    on compiled Triton grouped kernels, chosen in the pipeline's select stage and listed in the
    graph reports (issue 17), against float64; an empty group and a one-token group included."""
    from tilewright.kinds import problem_from_json

    gen = torch.Generator().manual_seed(0)
    offs = torch.tensor([0, 1, 90, 200], dtype=torch.int32, device="cuda")
    a = torch.randn(200, 64, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
    b = torch.randn(4, 64, 96, generator=gen).to("cuda", torch.bfloat16).requires_grad_()

    def f(a, b, offs):
        return torch.nn.functional.silu(torch._grouped_mm(a, b, offs=offs)) * 2

    ad, bd = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    start, parts = 0, []
    for g, end in enumerate(offs.tolist()):
        parts.append(torch.nn.functional.silu(ad[start:end] @ bd[g]) * 2)
        start = end
    ref = torch.cat(parts)
    ref.square().sum().backward()
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(f, backend="tilewright")(a, b, offs)
        out.float().square().sum().backward()
    assert rel_err(out, ref) < 2e-2 and rel_err(a.grad, ad.grad) < 2e-2 and rel_err(b.grad, bd.grad) < 2e-2
    grouped = [k for r in reports for k in r.kernels if k.kind == "grouped_gemm"]
    assert sorted(problem_from_json(k.problem_json).case for k in grouped) == ["2d2d", "2d3d", "2d3d"]
    assert all(k.winner.startswith("triton.") for k in grouped), [k.winner for k in grouped]
    assert no_workers_left()


def test_scans_and_scatters_on_the_gpu(fresh_cache):
    """Scans (tl.associative_scan, persistent and over rows past 4096 where the policy loops)
    and scatters (atomics with duplicates, the NaN exchange of float amax) compiled for the GPU
    against eager in float64; every loop kernel on Triton."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(8, 5000, device="cuda", generator=g)
    idx = torch.randint(0, 64, (4096,), device="cuda", generator=g)
    vals = torch.randn(4096, 32, device="cuda", generator=g)
    vals[5, 3] = float("nan")
    base = torch.randn(64, 32, device="cuda", generator=g)

    def fn(x, idx, vals, base):
        c = torch.cummax(x, 1)
        return (x.exp().cumsum(1) * 0.5, c.values, c.indices, torch.logcumsumexp(x, 1),
                torch.index_put(base, (idx,), vals.sin(), accumulate=True),
                base.scatter_reduce(0, idx[:, None].expand(-1, 32), vals, "amax"))
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(fn, backend="tilewright")(x, idx, vals, base)
    ref = fn(x.double(), idx, vals.double(), base.double())
    for o, r in zip(out, ref):
        if o.is_floating_point():
            assert torch.equal(o.isnan(), r.isnan())
            fin = r.isfinite()
            assert rel_err(o[fin], r[fin]) < 1e-4
        else:
            assert torch.equal(o, r)
    kernels = [k for r in reports for k in r.kernels]
    assert kernels and all(k.winner.startswith("triton.") for k in kernels), [k.winner for k in kernels]
