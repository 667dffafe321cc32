"""Ahead-of-time builds of loop kernels (pointwise, reduction) beside the GEMMs, and their
tensor-descriptor path: numbers in the Triton interpreter against the float64 torch reference
with poisoned outputs, TDM (``tensor_load_to_lds``) in the gfx1250 build, vector loads and the
arch's own ISA elsewhere (compile-only; no GPU needed)."""

from __future__ import annotations

import pytest
import torch

import tilewright

from tilewright.autotune.kinds import _loop_error, make_loop_inputs, poisoned_loop_outputs
from tilewright.autotune.loop_policy import LoopPolicy
from tilewright.compiler import aot
from tilewright.compiler.capture import ModelSpec, capture_kernels, load_model
from tilewright.problem import GemmProblem, LoopProblem
from tilewright.runtime.aot import CompileJob, compile_jobs
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import get_target, triton_can_target
from tilewright.runtime.verify import verify
from tilewright.templates import get_template
from tilewright.templates.aten.loops import render_torch
from tilewright.templates.triton.descriptors import MIN_DESC_RBLOCK, plan_descriptors

CPU = get_target("cpu")
GFX1250 = get_target("gfx1250")
needs_gfx1250 = pytest.mark.skipif(triton_can_target(GFX1250) is not None,
                                   reason=str(triton_can_target(GFX1250)))


@pytest.fixture(scope="module")
def llama() -> list:
    """The demo Llama's kernels, captured as ``tilewright aot`` does (once per module)."""
    return capture_kernels(load_model("tilewright.demo.models:llama_example"))


def loops(captured) -> list[LoopProblem]:
    return [c.problem for c in captured if isinstance(c.problem, LoopProblem)]


def rms_norm(captured) -> LoopProblem:
    """The Llama's RMSNorm kernel: a reduction whose weight, rows and output are all dense."""
    for p in loops(captured):
        plan = plan_descriptors(p.kernel, p.size_map)
        if p.kind == "reduction" and "rsqrt" in p.op and plan.stores and \
                {d.pattern for d in plan.loads.values()} == {"r", "xr"}:
            return p
    raise AssertionError(f"no RMSNorm kernel among {[p.describe() for p in loops(captured)]}")


class _Spy:
    """Stands in for a module's kernel and records the ``USE_DESC`` each launch passes."""

    def __init__(self, kernel):
        self.kernel, self.use_desc = kernel, []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.use_desc.append(kwargs.get("USE_DESC"))
            return self.kernel[grid](*args, **kwargs)
        return run


def run_interpreted(problem: LoopProblem, params: dict, tensors=None):
    """Render ``problem`` for the interpreter, run it into NaN-poisoned outputs, and return
    (error, tolerance) against the torch reference and the ``USE_DESC`` the launcher chose."""
    template = get_template(f"triton.{problem.kind}")
    rendered = template.render(problem, params, CPU)
    module = load_module(rendered.source, name=f"tw_desc_{problem.stable_hash()}", interpret=True)
    spy = _Spy(getattr(module, f"tw_{problem.kind}"))
    setattr(module, f"tw_{problem.kind}", spy)
    x = make_loop_inputs(problem, "cpu", seed=3)
    if tensors is not None:
        x.tensors = tensors(x.tensors)
    got = module.launch(*x.tensors, *x.sizes, outs=poisoned_loop_outputs(problem, "cpu"))
    ref = load_module(render_torch(problem), name="tw_desc_ref", interpret=False).launch(
        *x.tensors, *x.sizes, reference=True)
    return _loop_error(problem, got, ref, False), spy.use_desc, rendered


def test_capture_collects_loop_kernels_beside_gemms(llama):
    kinds = [type(c.problem) for c in llama if type(c.problem) in (GemmProblem, LoopProblem)]
    assert GemmProblem in kinds and LoopProblem in kinds
    assert kinds == sorted(kinds, key=lambda k: k is LoopProblem), "GEMMs first, then loop kernels"
    hashes = [p.stable_hash() for p in loops(llama)]
    assert len(hashes) == len(set(hashes)), "loop problems are deduplicated"
    assert {p.kind for p in loops(llama)} == {"pointwise", "reduction"}
    # every layer's RMSNorm is one problem with several uses
    uses = {c.problem.stable_hash(): c.uses for c in llama if isinstance(c.problem, LoopProblem)}
    assert len(uses[rms_norm(llama).stable_hash()]) >= 2


def test_descriptor_path_matches_the_reference_in_the_interpreter(llama):
    ran = []
    for p in loops(llama):
        shapes = [{"XBLOCK": 16, "num_warps": 4}] if p.kind == "pointwise" else [
            {"XBLOCK": 4, "PERSISTENT": True, "num_warps": 4},
            {"XBLOCK": 2, "PERSISTENT": False, "RBLOCK": 32, "num_warps": 4}]
        for params in shapes:
            params = params | {"DESC": True}
            if get_template(f"triton.{p.kind}").check(params, p, CPU) is not None:
                continue
            (err, tol), use_desc, rendered = run_interpreted(p, params)
            assert "tl.make_tensor_descriptor" in rendered.source
            assert use_desc == [True], "the launcher took the pointer body"
            assert err <= tol, f"{p.describe()} {params}: error {err:.3g} > {tol:g}"
            ran.append(p.op)
    assert any("rsqrt" in op for op in ran) and any("amax" in op for op in ran), ran


def test_descriptor_kernel_falls_back_to_pointers_when_the_layout_disagrees(llama):
    p = rms_norm(llama)
    row = next(b for b in p.kernel.inputs if len(b.shape) == 3)  # the normalised activations
    k = [b.name for b in p.kernel.inputs].index(row.name)

    def misaligned(tensors):  # same values, the data one element off a 16-byte boundary
        t = tensors[k]
        buf = torch.empty(t.numel() + 1, dtype=t.dtype)
        moved = buf[1:].view(t.shape)
        moved.copy_(t)
        return tensors[:k] + [moved] + tensors[k + 1:]

    params = {"XBLOCK": 4, "PERSISTENT": True, "num_warps": 4, "DESC": True}
    (err, tol), use_desc, _ = run_interpreted(p, params, misaligned)
    assert use_desc == [False] and err <= tol

    def transposed_rows(tensors):  # a layout whose rows do not collapse into one stride
        t = tensors[k]
        other = t.transpose(0, 1).contiguous().transpose(0, 1)
        return tensors[:k] + [other] + tensors[k + 1:]

    (err, tol), use_desc, _ = run_interpreted(p, params, transposed_rows)
    assert use_desc == [False] and err <= tol


def test_short_rows_get_a_block_floor_on_the_descriptor_path():
    # rows of 4 fp32 values: a 4-wide block is 16 bytes, but the floor keeps RBLOCK >= 16
    spec = ModelSpec(lambda x: torch.softmax(x, -1), (torch.randn(64, 4),), {}, "softmax")
    with tilewright.config.patch(unroll_reductions=0):  # else the short rows become pointwise
        (p,) = loops(capture_kernels(spec))
    assert p.kind == "reduction" and p.rnumel == 4
    template = get_template("triton.reduction")
    params = {"XBLOCK": 8, "PERSISTENT": True, "num_warps": 2, "DESC": True}
    assert template.block_r(p, params) == MIN_DESC_RBLOCK
    assert template.block_r(p, params | {"DESC": False}) == 4
    (err, tol), use_desc, rendered = run_interpreted(p, params)
    assert use_desc == [True] and err <= tol
    assert f", {MIN_DESC_RBLOCK})" in rendered.source  # the launcher's RBLOCK floor
    if triton_can_target(GFX1250) is None:
        spec = template.render(p, params, GFX1250).aot
        assert spec.constexprs["RBLOCK"] == MIN_DESC_RBLOCK and spec.constexprs["USE_DESC"] is True


def test_descriptors_are_a_tdm_capability(llama):
    p = rms_norm(llama)
    template = get_template("triton.reduction")
    params = {"XBLOCK": 1, "PERSISTENT": True, "num_warps": 1, "DESC": True}
    for name in ("sm_90a", "gfx950"):
        target = get_target(name)
        assert "Tensor Data Mover" in template.check(params, p, target)
        assert not any(q.get("DESC") for _, q in LoopPolicy("reduction").ranked(p, target, template))
    if triton_can_target(GFX1250) is None:
        ranked = LoopPolicy("reduction").ranked(p, GFX1250, template)
        assert ranked[0][1]["DESC"], "the cost model prefers the descriptor path on gfx1250"
        assert any(not q["DESC"] for _, q in ranked), "the pointer path stays a candidate"
    # a kernel with no dense access keeps pointers everywhere, with the reason
    gathers = [q for q in loops(llama) if not plan_descriptors(q.kernel, q.size_map)]
    for q in gathers:
        why = get_template(f"triton.{q.kind}").check({"DESC": True, "XBLOCK": 16, "num_warps": 4}, q, CPU)
        assert why and "dense" in why


@needs_gfx1250
def test_aot_plan_has_the_loop_kernels_of_every_target(llama):
    targets = [get_target("sm_90a"), GFX1250]
    kernels, refused = aot.plan(llama, targets)
    names = [k.name for k in kernels]
    assert len(names) == len(set(names))
    for t in targets:
        mine = [k for k in kernels if k.target == t]
        # (and the demo Llama's attention: tests/test_aot_attention.py)
        assert {k.kind for k in mine} == {"gemm", "pointwise", "reduction", "attention"}
        assert len([k for k in mine if k.kind in ("pointwise", "reduction")]) == len(loops(llama))
        desc = [k for k in mine if k.params.get("DESC") and k.kind in ("pointwise", "reduction")]
        assert bool(desc) == (t is GFX1250)
    rms = next(k for k in kernels if k.target is GFX1250 and k.captured.problem == rms_norm(llama))
    assert rms.params["DESC"] and rms.job.spec["constexprs"]["USE_DESC"] is True
    assert {"xnumel", "rnumel"} <= set(rms.job.spec["divisible_by_16"])
    assert rms.to_json()["kind"] == "reduction"


@needs_gfx1250
def test_gfx1250_rmsnorm_builds_to_tdm_and_others_to_vector_loads(llama, tmp_path):
    """Compile-only: the RMSNorm for gfx1250 through descriptors (TDM), and with pointers for
    sm_90a and gfx950 (vector loads); the pointer kernel on gfx1250 has no TDM."""
    p = rms_norm(llama)
    template = get_template("triton.reduction")
    # (target, descriptors, rows per program): a 64-wide gfx950 wave needs 4 rows of 128 bf16
    # to give each lane 16 bytes (one row is 4 bytes a lane: no vector load is promised then)
    cases = {"gfx1250_desc": (GFX1250, True, 1), "gfx1250_ptr": (GFX1250, False, 1),
             "sm_90a": (get_target("sm_90a"), False, 1), "gfx950": (get_target("gfx950"), False, 4),
             "gfx950_1row": (get_target("gfx950"), False, 1)}
    jobs, params = [], {}
    for name, (target, desc, rows) in cases.items():
        params[name] = {"XBLOCK": rows, "PERSISTENT": True, "num_warps": 1, "DESC": desc}
        rendered = template.render(p, params[name], target)
        jobs.append(CompileJob(name, rendered.source, rendered.aot.to_json(), target.triton))
    results = {r.name: r for r in compile_jobs(jobs, tmp_path, workers=2, timeout_s=300)}
    counts = {}
    for name, (target, _, _) in cases.items():
        r = results[name]
        assert r.ok, r.error
        checks = template.expected_instructions(p, params[name], target)
        v = verify({k: tmp_path / a for k, a in r.artifacts.items()}, checks)
        assert v.ok, (name, v.failures)
        counts[name] = v.counts
    assert counts["gfx1250_desc"]["tensor_load_to_lds"] >= 2  # rows and weight
    assert counts["gfx1250_desc"]["tensor_store_from_lds"] >= 1
    assert any("load_b" in pat for pat in counts["gfx1250_ptr"])  # vector loads instead
    amdgcn = (tmp_path / results["gfx1250_ptr"].artifacts["amdgcn"]).read_text()
    assert "tensor_load_to_lds" not in amdgcn
    assert any("ld" in pat and "v[248]" in pat for pat in counts["sm_90a"])
    assert any("dwordx" in pat for pat in counts["gfx950"])
    assert list(counts["gfx950_1row"]) == [r'\.amdgcn_target "[^"]*gfx950"']  # its own ISA, nothing more


@pytest.mark.slow
def test_every_llama_loop_kernel_builds_for_every_target(llama, tmp_path):
    targets = [get_target(t) for t in ("sm_90a", "sm_100a", "gfx950", "gfx1250")]
    targets = [t for t in targets if triton_can_target(t) is None]
    kernels, _ = aot.plan([c for c in llama if isinstance(c.problem, LoopProblem)], targets)
    results = {r.name: r for r in compile_jobs([k.job for k in kernels], tmp_path, workers=2)}
    failures = []
    for k in kernels:
        r = results[k.name]
        if not r.ok:
            failures.append(f"{k.name}: {r.status} {r.error[-300:]}")
            continue
        checks = k.template.expected_instructions(k.captured.problem, k.params, k.target)
        v = verify({s: tmp_path / a for s, a in r.artifacts.items()}, checks)
        if not v.ok:
            failures.append(f"{k.name}: {v.failures}")
    assert not failures, "\n".join(failures)
    # one Triton kernel per loop kernel and target; FlyDSL's loop templates add gfx950 ones
    assert len([k for k in kernels if k.template.backend == "triton"]) == len(targets) * len(loops(llama))
    assert {k.target.arch for k in kernels if k.template.backend != "triton"} <= {"gfx950"}
