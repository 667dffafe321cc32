"""Helion templates (tilewright/templates/helion/, issue 19 part 2): residual RMSNorm, softmax
and a GEMM with its epilogue, written as Helion kernels and rendered by Helion's Triton code
generation.

Numerics in the Triton interpreter against float64 with NaN-poisoned outputs (and the special
values of the loop-kernel check); the IR recogniser taking exactly its computation and refusing
near misses; selection by measurement (forced, and competing with the jinja Triton templates);
AOT builds for sm_90a, sm_100a, gfx950 and gfx1250 with instruction checks (wgmma, tcgen05,
v_mfma, v_wmma; TMA and TDM with tensor-descriptor indexing); cache keys that follow Helion's
version and the kernel source.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

try:  # a helion that is there but does not import with this torch skips too (1.5.1 on 2.11)
    import helion  # noqa: F401
except ImportError as e:
    pytest.skip(f"helion does not import here: {e}", allow_module_level=True)

import helion.language as hl  # noqa: E402

import tilewright  # noqa: E402
from tilewright.autotune.cache import TuningCache  # noqa: E402
from tilewright.autotune.candidates import Candidate  # noqa: E402
from tilewright.autotune.select import select  # noqa: E402
from tilewright.compiler import aot  # noqa: E402
from tilewright.compiler.capture import ModelSpec  # noqa: E402
from tilewright.compiler.report import collect_reports  # noqa: E402
from tilewright.compiler.kernel_factory import TemplateKernelFactory  # noqa: E402
from tilewright.kinds import kind_of  # noqa: E402
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem  # noqa: E402
from tilewright.runtime.aot import CompileJob, compile_jobs  # noqa: E402
from tilewright.runtime.targets import get_target  # noqa: E402
from tilewright.runtime.verify import verify  # noqa: E402
from tilewright.templates import get_template  # noqa: E402
from tilewright.templates.helion import base as helion_base  # noqa: E402

CPU = get_target("cpu")
FACTORY = TemplateKernelFactory()


class LlamaRMSNorm(nn.Module):
    """Hugging Face's form: the normalised value is rounded to the input dtype before the
    weight multiplies it; after a residual add that is returned too."""

    def __init__(self, n: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n))
        self.eps = eps

    def forward(self, x, res):
        h = x + res
        hf = h.float()
        y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype), h


class TorchRMSNorm(nn.Module):
    def __init__(self, n: int, scale: float | None = None, residual: bool = True):
        super().__init__()
        self.norm = nn.RMSNorm(n, eps=1e-5)
        self.scale, self.residual = scale, residual

    def forward(self, x, res):
        h = x + res if self.residual else x
        y = self.norm(h)
        return (y * self.scale if self.scale else y), h


class Softmax(nn.Module):
    def __init__(self, scale: float | None = None, log: bool = False):
        super().__init__()
        self.scale, self.log = scale, log

    def forward(self, x):
        x = x * self.scale if self.scale else x
        return torch.log_softmax(x, -1) if self.log else torch.softmax(x, -1)


def capture(model: nn.Module, *inputs: torch.Tensor):
    (cap,) = [c for c in aot.capture_kernels(ModelSpec(model, inputs, {}, "m")) if c.problem.kind == "reduction"]
    return cap.problem


@pytest.fixture(scope="module")
def problems():
    """Loop problems from small models (rows and widths not multiples of any block)."""
    torch.manual_seed(0)
    f16, bf16 = torch.float16, torch.bfloat16
    return {
        "llama_fp16": capture(LlamaRMSNorm(40).to(f16), torch.randn(24, 40, dtype=f16), torch.randn(24, 40, dtype=f16)),
        "torch_bf16_3d": capture(TorchRMSNorm(40).to(bf16), torch.randn(2, 12, 40, dtype=bf16),
                                 torch.randn(2, 12, 40, dtype=bf16)),
        "torch_fp32": capture(TorchRMSNorm(72), torch.randn(7, 72), torch.randn(7, 72)),
        "softmax_fp16": capture(Softmax(), torch.randn(24, 40, dtype=f16)),
        "softmax_fp32": capture(Softmax(), torch.randn(5, 100)),
        "softmax_wide": capture(Softmax(), torch.randn(16, 64, dtype=f16)),  # rows of 128 bytes: TMA-able
        # near misses
        "rms_scaled": capture(TorchRMSNorm(40, scale=2.0), torch.randn(24, 40), torch.randn(24, 40)),
        "rms_no_residual": capture(TorchRMSNorm(40, residual=False), torch.randn(24, 40), torch.randn(24, 40)),
        "softmax_scaled": capture(Softmax(scale=0.5), torch.randn(24, 40)),
        "log_softmax": capture(Softmax(log=True), torch.randn(24, 40)),
    }


GEMMS = {
    dt: GemmProblem(M=23, N=37, K=41, dtype=dt, layout_b="col",
                    epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu"), EpilogueOp("add", input=1, scale=0.5),
                              EpilogueOp("sub", scalar=0.25, reverse=True)),
                    epilogue_inputs=(EpilogueInput("N", dt), EpilogueInput("MN", dt)))
    for dt in ("fp16", "bf16", "fp32")}


def test_the_recogniser_takes_exactly_its_computation(problems):
    rms, soft = get_template("helion.rms_norm"), get_template("helion.softmax")
    for name in ("llama_fp16", "torch_bf16_3d", "torch_fp32"):
        assert rms.problem_support(problems[name], CPU), name
        assert not soft.problem_support(problems[name], CPU)
    for name in ("softmax_fp16", "softmax_fp32"):
        assert soft.problem_support(problems[name], CPU), name
        assert not rms.problem_support(problems[name], CPU)
    for name in ("rms_scaled", "rms_no_residual", "softmax_scaled", "log_softmax"):
        for t in (rms, soft):
            why = t.problem_support(problems[name], CPU)
            assert not why and why.reason, (name, t.id)
    # the two RMSNorm forms are told apart: the rounding before the weight is a constexpr
    assert "True" in rms.helion_call(problems["llama_fp16"], CPU).args[-1]
    assert "False" in rms.helion_call(problems["torch_fp32"], CPU).args[-1]


def test_the_gemm_refuses_what_it_does_not_compute_with_the_reason():
    t = get_template("helion.gemm")
    base = GEMMS["fp16"]
    assert t.problem_support(base, CPU)
    for change, words in ((dict(batched=True, batch=2), "batched"), (dict(layout_a="strided"), "layouts"),
                          (dict(store_acc=True), "stored product"),
                          (dict(epilogue=(), epilogue_inputs=(), epilogue_ir='{"nodes":[["acc","fp32",[],null]],"roots":[0]}'),
                           "IR")):
        why = t.problem_support(dataclasses.replace(base, **change), CPU)
        assert not why and words in why.reason, (change, why)


def _run(template, problem, params, inputs=None):
    kind = kind_of(problem)
    launch = FACTORY.build(problem, Candidate.of(template.id, template.source_hash, template.space.complete(params)), CPU)
    x = inputs if inputs is not None else kind.make_inputs(problem, "cpu", 1)
    return kind.run(launch, x, kind.poisoned(problem, "cpu")), x


@pytest.mark.parametrize("name", ["llama_fp16", "torch_bf16_3d", "torch_fp32", "softmax_fp16", "softmax_fp32"])
def test_row_templates_in_the_interpreter_match_float64(problems, name):
    problem = problems[name]
    kind = kind_of(problem)
    t = get_template("helion.softmax" if name.startswith("softmax") else "helion.rms_norm")
    seeds = t.seed_params(problem, CPU)
    assert seeds
    for params in seeds:
        out, x = _run(t, problem, params)
        err, tol = kind.error(problem, out, kind.reference(problem, x, FACTORY), False)
        assert err <= tol, (params, err, tol)
    # the tuner's second input set: inf, NaN, signed zeros and subnormals in every row
    special = kind.special_inputs(problem, "cpu", 3)
    ref = kind.special_reference(problem, special, FACTORY)
    if ref is not None:
        out, _ = _run(t, problem, seeds[0], special)
        err, tol = kind.error(problem, out, ref, False)
        assert err <= tol, ("special values", err)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_the_gemm_with_its_epilogue_in_the_interpreter_matches_float64(dtype):
    problem = GEMMS[dtype]
    kind = kind_of(problem)
    t = get_template("helion.gemm")
    for params in t.seed_params(problem, CPU):
        out, x = _run(t, problem, params)
        err, tol = kind.error(problem, out, kind.reference(problem, x, FACTORY), False)
        assert err <= tol, (params, err, tol)


def test_a_static_kernel_runs_another_layout_through_a_copy(problems):
    # bug guarded: Helion bakes sizes and strides into a static-shape kernel; a tensor of
    # another layout (input or output) must be read and written right, not with baked strides
    problem = problems["softmax_fp32"]
    t = get_template("helion.softmax")
    launch = FACTORY.build(problem, Candidate.of(t.id, t.source_hash, t.space.complete(t.seed_params(problem, CPU)[0])), CPU)
    x = torch.randn(100, 5).t()  # (5, 100), column-major
    out = torch.full((100, 5), float("nan")).t()
    (got,) = launch(x, outs=(out,))
    assert got is out and torch.allclose(out, torch.softmax(x, -1), atol=1e-6)
    with pytest.raises(ValueError, match="static-shape Helion kernel"):
        launch(torch.randn(6, 100))  # another problem entirely


class Block(nn.Module):
    """A residual RMSNorm, a Linear with bias and GELU, a Linear, a softmax."""

    def __init__(self, d: int = 40, f: int = 48):
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-5)
        self.up, self.down = nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x, res):
        h = x + res
        z = nn.functional.gelu(self.up(self.norm(h)))
        return torch.softmax(self.down(z), dim=-1), h


def test_forced_helion_runs_a_compiled_model_and_is_cached(tmp_path):
    torch.manual_seed(0)
    model = Block().half()
    x, r = torch.randn(24, 40, dtype=torch.float16), torch.randn(24, 40, dtype=torch.float16)
    with torch.no_grad(), collect_reports() as reports, tilewright.config.patch(
            force_backend="helion", cache_dir=str(tmp_path), strict=True):
        out, h = torch.compile(model, backend="tilewright")(x, r)
    ref = Block().double()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        eo, eh = ref(x.double(), r.double())
    for got, want in ((out, eo), (h, eh)):
        assert ((got.double() - want).norm() / want.norm()).item() < 2e-3
    winners = [g.winner for rep in reports for g in rep.gemms] + [k.winner for rep in reports for k in rep.kernels]
    assert len(winners) == 4 and all(w.startswith("helion.") for w in winners), winners
    cache = (tmp_path / "autotune" / "tuning.json").read_text()
    for tid in ("helion.gemm", "helion.rms_norm", "helion.softmax"):
        assert f"{tid}@{get_template(tid).source_hash}" in cache


@pytest.mark.parametrize("name", ["torch_bf16_3d", "softmax_fp16"])
def test_helion_competes_with_the_jinja_triton_templates(problems, tmp_path, name):
    problem = problems[name]
    with tilewright.config.patch(force_backend="triton,helion", cache_dir=str(tmp_path)):
        sel = select(problem, CPU, FACTORY, cache=TuningCache(tmp_path / "tuning.json"))
    measured = {r.candidate.backend for r in sel.results if r.record.status == "ok"}
    assert {"triton", "helion"} <= measured, [(r.candidate.name, r.record.status) for r in sel.results]
    assert sel.measured and sel.winner.backend in ("triton", "helion")
    fastest = min((r for r in sel.results if r.record.status == "ok" and r.candidate.backend != "aten"),
                  key=lambda r: r.record.median_ms)
    assert sel.winner_record.median_ms <= fastest.record.median_ms * 3  # within noise of the best


def test_the_cache_key_follows_helions_version_and_the_kernel_source(monkeypatch):
    t = get_template("helion.softmax")
    before = t.source_hash
    monkeypatch.setattr(helion_base, "helion_version", lambda: "0.0.0-other")
    fresh = type(t)()
    assert fresh.source_hash != before
    monkeypatch.undo()
    assert type(t)().source_hash == before
    other = type("OtherKernel", (type(t),), {"kernel": staticmethod(get_template("helion.rms_norm").function)})()
    assert other.source_hash != before  # another kernel's module enters the hash


AOT_TARGETS = ("sm_90a", "sm_100a", "gfx950", "gfx1250")


def test_aot_builds_for_every_triton_target_with_instruction_checks(problems, tmp_path):
    gemm = get_template("helion.gemm")
    rms = get_template("helion.rms_norm")
    big = dataclasses.replace(GEMMS["fp16"], M=128, N=128, K=64)
    tile = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
    plan = []
    for arch in AOT_TARGETS:
        target = get_target(arch)
        plan.append((gemm, big, tile, target))
        if target.has("tma") or target.has("tdm"):
            plan.append((gemm, big, tile | {"indexing": "tensor_descriptor"}, target))
        plan.append((rms, problems["llama_fp16"], {"XBLOCK": 8, "num_warps": 4}, target))
    soft = get_template("helion.softmax")
    for arch in ("sm_90a", "gfx1250"):
        plan.append((soft, problems["softmax_wide"], {"XBLOCK": 8, "num_warps": 4, "indexing": "tensor_descriptor"},
                     get_target(arch)))
    jobs, checks = [], []
    for i, (t, problem, params, target) in enumerate(plan):
        assert t.check(t.space.complete(params), problem, target) is None, (t.id, params, target.name)
        r = t.render(problem, params, target)
        jobs.append(CompileJob(f"{target.arch}_{t.id}_{i}", r.source, r.aot.to_json(), target.triton))
        checks.append(t.expected_instructions(problem, params, target))
    results = compile_jobs(jobs, tmp_path, workers=2, timeout_s=300)
    promised = set()
    for job, res, check in zip(jobs, results, checks):
        assert res.ok, (job.name, res.error)
        v = verify({s: tmp_path / rel for s, rel in res.artifacts.items()}, check)
        assert v.ok, (job.name, v.failures)
        promised |= {p for p, n in v.counts.items() if n}
    for instr in ("wgmma", "tcgen05", "v_mfma", "v_wmma", "cp\\.async\\.bulk\\.tensor", "tensor_load_to_lds"):
        assert any(instr in p for p in promised), instr


def test_helions_flydsl_softmax_builds_for_gfx950(problems, tmp_path):
    from tilewright.templates.flydsl import runtime as fly_runtime

    if fly_runtime.toolchain_problem():
        pytest.skip(fly_runtime.toolchain_problem())
    t = get_template("helion.softmax_flydsl")
    problem = problems["softmax_wide"]
    target = get_target("gfx950")
    assert t.supports(problem, target) and not t.supports(problem, get_target("sm_90a"))
    assert not t.supports(problems["llama_fp16"], target)  # softmax rows only
    r = t.render(problem, {}, target)
    (res,) = compile_jobs([CompileJob("helion_softmax_flydsl", r.source, r.aot.to_json(), target.triton)],
                          tmp_path, workers=1, timeout_s=300)
    assert res.ok, res.error
    v = verify({s: tmp_path / rel for s, rel in res.artifacts.items()}, t.expected_instructions(problem, {}, target))
    assert v.ok, v.failures


def test_a_dynamic_problem_runs_any_size_of_its_bucket(tmp_path):
    # dynamic dims render with Helion's static_shapes=False: sizes and strides are arguments
    torch.manual_seed(0)
    model = TorchRMSNorm(40).half()
    ref = TorchRMSNorm(40).double()
    ref.load_state_dict(model.state_dict())
    f = torch.compile(model, backend="tilewright", dynamic=True)
    with torch.no_grad(), collect_reports() as reports, tilewright.config.patch(
            force_backend="helion", cache_dir=str(tmp_path), strict=True):
        for rows in (24, 13, 31):
            x, r = torch.randn(rows, 40, dtype=torch.float16), torch.randn(rows, 40, dtype=torch.float16)
            out, _ = f(x, r)
            want, _ = ref(x.double(), r.double())
            assert ((out.double() - want).norm() / want.norm()).item() < 2e-3, rows
    assert any(k.winner.startswith("helion.rms_norm") for rep in reports for k in rep.kernels)


def _three_args(x, y, out):  # takes three tensors; a softmax problem hands it two
    for tile in hl.tile(x.size(0)):
        out[tile, :] = x[tile, :] + y[tile, :]


def _softmax_rows_only(problem, target):
    from tilewright.templates import SUPPORTED
    from tilewright.templates.helion.softmax import match_softmax

    found = match_softmax(problem)
    return found if isinstance(found, tilewright.templates.Support) else SUPPORTED



def test_a_kernel_helion_cannot_bind_costs_only_itself(problems, tmp_path):
    from tilewright.templates import unregister_template
    from tilewright.templates.helion import helion_template

    broken = helion_template(_three_args, op="reduction", supports=_softmax_rows_only, name="broken_rows")
    try:
        problem = problems["softmax_fp16"]
        assert broken.problem_support(problem, CPU)
        assert broken.seed_params(problem, CPU) == []  # Helion refuses to bind it: no settings
        assert "Helion" in broken.check({}, problem, CPU)
        with tilewright.config.patch(force_backend="helion"):
            sel = select(problem, CPU, FACTORY, cache=TuningCache(tmp_path / "tuning.json"))
        assert sel.winner.template_id == "helion.softmax"
        assert not any(r.candidate.template_id == broken.id for r in sel.results)
    finally:
        unregister_template(broken.id)


def test_registering_the_templates_imports_no_helion():
    """Importing Helion takes ~2.4 s; registering its templates (which every compiled model does,
    on its first call, CPU ones included) must not pay it. It was imported by three kernel
    modules at import time, and a CPU first call took 4.1 s instead of 1.0 s."""
    import subprocess
    import sys

    code = ("import sys; from tilewright.templates import ensure_registered, get_template; "
            "ensure_registered(); get_template('helion.softmax'); "
            "print(sorted(m for m in ('helion', 'cutlass', 'flydsl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
# test_a_dynamic_problem_runs_any_size_of_its_bucket guards the up-front build listing too: under a
# forced Helion it listed candidates at the trace-time bucket and the interpreter later aborted
