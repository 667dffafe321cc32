"""The tensor-descriptor grouped GEMM (``triton.grouped_gemm_desc``) and the fused gated product
(``GroupedGemmProblem.glu``) in both Triton grouped templates: numbers in the Triton interpreter
against float64 over ragged offsets (empty groups, a one-token group, unaligned totals and
unaligned group starts), outputs poisoned with NaN; refusals with their reasons; and the sm_90a
AOT build, which must issue TMA loads (``cp.async.bulk.tensor``) and wgmma."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tilewright.autotune.grouped_policy import GroupedGemmPolicy
from tilewright.autotune.kinds import KINDS
from tilewright.grouped import RAGGED, GroupedGemmProblem, make_inputs, poisoned_output, reference, run
from tilewright.problem import EpilogueInput, EpilogueOp
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

DESC, PLAIN = "triton.grouped_gemm_desc", "triton.grouped_gemm"
TILE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}
# (case, G, M, N, K, end offsets): ragged totals of 37 (unaligned), an empty group, a one-token
# group, and group starts (1, 17; 5, 6; 3, 4) that are not 16-byte aligned
CASES = [
    ("2d3d", 4, 37, 48, 24, [0, 1, 17, 37]),
    ("2d2d", 4, 16, 48, 37, [5, 5, 6, 37]),
    ("3d2d", 4, 16, 37, 24, [3, 3, 4, 37]),
    ("3d3d", 3, 16, 48, 24, None),
]
LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row")]


def problem(case, G, M, N, K, dtype="bf16", out_dtype="fp32", **kw) -> GroupedGemmProblem:
    # the ragged total is dynamic, as tilewright.kernels.grouped builds it (bucketed): the
    # launcher pads a ragged contiguous dim at run time instead of refusing it
    rag = RAGGED[case]
    return GroupedGemmProblem(case, G, M, N, K, dtype, out_dtype, dynamic=frozenset({rag} if rag else ()), **kw)


def launch_of(template_id, p, cpu, params=TILE):
    r = get_template(template_id).render(p, params, cpu)
    return load_module(r.source, name=r.name, interpret=True).launch


def check(template_id, p, offs, cpu, x=None):
    x = x or make_inputs(p, "cpu", 0, offs=None if offs is None else torch.tensor(offs, dtype=torch.int32))
    out = run(launch_of(template_id, p, cpu), x, poisoned_output(p, "cpu"))
    ref = reference(p, x)
    assert not torch.isnan(out).any(), "an element was left unwritten (poisoned NaN remains)"
    err, tol = KINDS["grouped_gemm"].error(p, out, ref, False)
    assert err <= tol, f"{template_id} {p.describe()}: rel error {err:.2e} > {tol:.0e}"
    return out, ref, x


# -- the descriptor template ----------------------------------------------------------------------
@pytest.mark.parametrize("case,G,M,N,K,offs", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("la,lb", LAYOUTS, ids=[f"{a}-{b}" for a, b in LAYOUTS])
def test_desc_cases_and_layouts(case, G, M, N, K, offs, la, lb, cpu):
    check(DESC, problem(case, G, M, N, K, layout_a=la, layout_b=lb), offs, cpu)


@pytest.mark.parametrize("case,G,M,N,K,offs", CASES, ids=[c[0] for c in CASES])
def test_desc_fp32_with_bias_silu(case, G, M, N, K, offs, cpu):
    bias = EpilogueInput("N" if case == "3d2d" else "BN", "fp32")
    p = problem(case, G, M, N, K, "fp32", "bf16", epilogue=(EpilogueOp("add", input=0), EpilogueOp("silu")),
                epilogue_inputs=(bias,))
    out, _, _ = check(DESC, p, offs, cpu)
    assert out.dtype == torch.bfloat16


def test_desc_ragged_k_never_reads_the_neighbours(cpu):
    # 2d2d: the K columns past offs[-1] belong to no group and hold NaN; a tile reaching past
    # a group's end reads them (and the next group's) through the descriptor, so only the
    # in-register mask keeps them out of the sums
    p = problem("2d2d", 3, 16, 32, 48, layout_a="col")
    x = make_inputs(p, "cpu", 3, offs=torch.tensor([7, 7, 29], dtype=torch.int32))
    x.a[:, 29:] = float("nan")
    x.b[29:] = float("nan")
    check(DESC, p, None, cpu, x=x)


def test_desc_rows_past_the_last_group_are_not_written(cpu):
    p = problem("2d3d", 3, 40, 32, 32)
    x = make_inputs(p, "cpu", 4, offs=torch.tensor([9, 9, 30], dtype=torch.int32))
    x.a[30:] = float("nan")  # an uninitialised tail, as MoE expert-parallel sentinels leave
    out = run(launch_of(DESC, p, cpu), x, poisoned_output(p, "cpu"))
    assert torch.isnan(out[30:]).all() and not torch.isnan(out[:30]).any()
    ref = reference(p, x)
    err, tol = KINDS["grouped_gemm"].error(p, out[:30], ref[:30], False)
    assert err <= tol


def test_desc_many_tiles_per_program(cpu):
    # 2 + 3 + 5 row tiles x 2 column tiles over 4 persistent programs
    p = problem("2d3d", 3, 160, 64, 32, layout_b="col")
    check(DESC, p, [32, 80, 160], cpu, x=None)


def test_desc_refusals_name_the_reason(cpu):
    t = get_template(DESC)
    static = GroupedGemmProblem("2d3d", 4, 64, 32, 20, "bf16")  # rows of A are 40 bytes
    assert "not a multiple of 16" in t.supports(static, cpu).reason
    assert "no TMA" in t.supports(GroupedGemmProblem("2d3d", 4, 64, 32, 32, "bf16"), get_target("cuda:sm_80")).reason
    strided = GroupedGemmProblem("2d3d", 4, 64, 32, 32, "bf16", layout_b="strided")
    assert "contiguous" in t.supports(strided, cpu).reason
    glu = GroupedGemmProblem("2d3d", 4, 64, 40, 32, "bf16", glu="silu")  # up half 20 columns (40 B) in
    assert "up half" in t.supports(glu, cpu).reason
    assert get_template(PLAIN).supports(glu, cpu)  # the pointer template takes it
    sm90 = get_target("cuda:sm_90a")
    big = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4}
    assert "shared memory" in t.check(big, GroupedGemmProblem("2d3d", 4, 4096, 512, 512, "bf16"), sm90)


# -- the fused gated product ------------------------------------------------------------------------
GLU_CASES = [c for c in CASES if c[0] != "3d2d"]


@pytest.mark.parametrize("template_id", [PLAIN, DESC])
@pytest.mark.parametrize("case,G,M,N,K,offs", GLU_CASES, ids=[c[0] for c in GLU_CASES])
def test_glu_matches_float64(template_id, case, G, M, N, K, offs, cpu):
    p = problem(case, G, M, N, K, glu="silu", layout_b="col")
    out, ref, x = check(template_id, p, offs, cpu)
    assert out.shape[-1] == N // 2
    # the reference itself, against the definition: act(gate) * up of the plain product
    acc = reference(problem(case, G, M, N, K, layout_b="col"), x)
    torch.testing.assert_close(ref, F.silu(acc[..., :N // 2]) * acc[..., N // 2:])


@pytest.mark.parametrize("template_id", [PLAIN, DESC])
def test_glu_then_epilogue_and_cast(template_id, cpu):
    # gelu_tanh(gate) * up, then times an output-shaped tensor (N/2 columns), stored as bf16
    p = problem("2d3d", 3, 40, 64, 32, glu="gelu_tanh", out_dtype="bf16",
                epilogue=(EpilogueOp("mul", input=0),), epilogue_inputs=(EpilogueInput("MN", "fp32"),))
    assert p.out_shape == (40, 32) and p.input_shape(p.epilogue_inputs[0]) == (40, 32)
    out, _, _ = check(template_id, p, [0, 1, 40], cpu)
    assert out.dtype == torch.bfloat16


def test_glu_problem_rules():
    with pytest.raises(ValueError, match="ragged"):
        GroupedGemmProblem("3d2d", 2, 8, 32, 8, "bf16", glu="silu")
    with pytest.raises(ValueError, match="even N"):
        GroupedGemmProblem("2d3d", 2, 8, 33, 8, "bf16", glu="silu")
    with pytest.raises(ValueError, match="known"):
        GroupedGemmProblem("2d3d", 2, 8, 32, 8, "bf16", glu="swish")
    p = GroupedGemmProblem("2d3d", 2, 8, 32, 8, "bf16", glu="silu")
    assert p.stable_hash() != GroupedGemmProblem("2d3d", 2, 8, 32, 8, "bf16").stable_hash()
    assert "glu" not in GroupedGemmProblem("2d3d", 2, 8, 32, 8, "bf16").to_json()  # old keys kept
    assert GroupedGemmProblem.from_json(p.to_json()) == p and "silu(gate)*up" in p.describe()


def test_policy_offers_glu_only_to_templates_that_render_it(cpu):
    import tilewright

    p = problem("2d3d", 4, 64, 64, 32, glu="silu")
    with tilewright.config.patch(force_backend="triton"):
        cands = GroupedGemmPolicy().candidates(p, cpu)
    ids = [c.template_id for c in cands]
    assert ids == ["aten.grouped_gemm", PLAIN, DESC]  # one tile per template in the interpreter
    assert all(getattr(get_template(i), "fuses_glu", False) for i in ids)


def test_desc_launcher_never_reads_offsets_on_the_host(cpu):
    for case, G, M, N, K, _ in CASES:
        src = get_template(DESC).render(problem(case, G, M, N, K), {}, cpu).source
        launcher = src[src.index("def launch"):]
        for sync in (".tolist(", ".item(", ".cpu(", "int(offs"):
            assert sync not in launcher, f"{case}: the launcher syncs on the offsets ({sync})"


# -- ahead of time, for sm_90a --------------------------------------------------------------------
def test_desc_aot_sm90a_uses_tma_and_wgmma(tmp_path):
    """Two builds (a few seconds each): the MoE forward with a fused SwiGLU over a transposed
    (column-major) 3-D weight, and the ragged-K weight gradient."""
    from tilewright.runtime.aot import CompileJob, compile_jobs
    from tilewright.runtime.verify import verify

    target, template = get_target("cuda:sm_90a"), get_template(DESC)
    params = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}
    problems = {"moe_up": GroupedGemmProblem("2d3d", 8, 4096, 1536, 2048, "bf16", layout_b="col", glu="silu",
                                             dynamic=frozenset({"M"})),
                "wgrad": GroupedGemmProblem("2d2d", 8, 2048, 768, 4096, "bf16", layout_a="col",
                                            dynamic=frozenset({"K"}))}
    jobs = []
    for name, p in problems.items():
        r = template.render(p, params, target)
        jobs.append(CompileJob(name, r.source, r.aot.to_json(), target.triton))
    for r in compile_jobs(jobs, tmp_path, workers=2, timeout_s=300):
        assert r.ok, f"{r.name}: {r.status} {r.error[-500:]}"
        checks = template.expected_instructions(problems[r.name], params, target)
        v = verify({k: tmp_path / p for k, p in r.artifacts.items()}, checks)
        assert v.ok, v.failures
        assert v.counts[r"cp\.async\.bulk\.tensor"] > 0 and r.metadata["shared"] <= target.smem_per_block


def test_compile_forward_and_backward_through_the_desc_template(monkeypatch, fresh_cache):
    """The MoE forward (a transposed 3-D weight, as HF stores it) and both gradients (dA a 2d3d
    call over B^T, dB the 2d2d ragged-K call over A^T) with only the descriptor template
    offered: every call runs it and matches eager."""
    import tilewright
    from tilewright.compiler.report import collect_reports
    from tilewright.kinds import problem_from_json
    from tilewright.templates.base import Support

    def grouped_kernels(reports):
        return [(problem_from_json(k.problem_json), k.winner.split("[")[0])
                for r in reports for k in r.kernels if k.kind == "grouped_gemm"]

    monkeypatch.setattr(get_template(PLAIN), "supports", lambda p, t: Support(False, "test: desc only"))
    gen = torch.Generator().manual_seed(5)
    offs = torch.tensor([0, 1, 19, 40], dtype=torch.int32)
    a = torch.randn(40, 32, generator=gen).bfloat16().requires_grad_(True)
    w = torch.randn(4, 48, 32, generator=gen).bfloat16().requires_grad_(True)

    def f(a, w, offs):
        return F.silu(F.grouped_mm(a, w.transpose(-1, -2), offs=offs)) * 2

    ref = f(a, w, offs)
    ref.float().square().sum().backward()
    ga, gw = a.grad.clone(), w.grad.clone()
    a.grad = w.grad = None
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(f, backend="tilewright")(a, w, offs)
        out.float().square().sum().backward()
    # chosen in the pipeline's select stage: the graph reports list them
    calls = [(p.case, t) for p, t in grouped_kernels(reports)]
    assert sorted(calls) == [("2d2d", DESC), ("2d3d", DESC), ("2d3d", DESC)]
    for x, y in ((out, ref), (a.grad, ga), (w.grad, gw)):
        assert ((x.double() - y.double()).norm() / y.double().norm()).item() < 2e-2
