"""On a CPU a compiled model makes no more ATen calls than eager needs (issue 20): loop kernels
carry the ATen ops they replaced as a candidate, a kernel that is one native op keeps that op,
values that read no memory are computed once per shape, casts that change nothing are gone, and
the choice is the tuner's, recorded in its cache like any other."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import tilewright
from conftest import rel_err
from tilewright.autotune import select as select_mod
from tilewright.autotune.cache import TuningCache
from tilewright.autotune.kinds import make_loop_inputs, poisoned_loop_outputs
from tilewright.autotune.loop_policy import LoopPolicy, offered_on
from tilewright.compiler.decompositions import decomposition_table
from tilewright.compiler.dispatches import counting
from tilewright.compiler.graph import FusedNode
from tilewright.compiler.lower import lower, lower_loop_nodes
from tilewright.compiler.programs import attach_programs
from tilewright.compiler.report import collect_reports
from tilewright.kinds.loop.fusion.schedule import schedule
from tilewright.compiler.kernel_factory import TemplateKernelFactory
from tilewright.problem import LoopProblem
from tilewright.templates import get_template
from tilewright.templates.aten.unfused import is_native

FACTORY = TemplateKernelFactory()


@pytest.fixture(autouse=True)
def _one_thread():
    # a thread pool on a shared 2-core machine times the scheduler, not the op (perf/run.py)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def g(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def problems_of(fn, *args) -> list[LoopProblem]:
    """The loop problems the pipeline makes for ``fn``, with their ATen programs."""
    gm = make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="fake")(*args)
    kg = lower(gm)
    lower_loop_nodes(kg, gm)
    schedule(kg, gm)
    attach_programs(kg, gm)
    return [n.problem for n in kg.nodes if isinstance(n, FusedNode)]


def run_candidate(problem: LoopProblem, template_id: str, params: dict, seed: int = 1):
    """The candidate's outputs (into NaN-poisoned buffers) and the float64 reference."""
    template = get_template(template_id)
    launch = FACTORY.compile(template.render(problem, params, tilewright_cpu()))
    x = make_loop_inputs(problem, "cpu", seed=seed)
    outs = poisoned_loop_outputs(problem, "cpu")
    got = launch(*x.tensors, *x.sizes, outs=outs)
    assert all(a is b for a, b in zip(got, outs))
    return launch, x, got, FACTORY.reference(problem, x)


def tilewright_cpu():
    from tilewright.runtime.targets import get_target

    return get_target("cpu")


def program_params(problem: LoopProblem) -> dict:
    from tilewright.templates.aten.unfused import program_digest

    return {"program": program_digest(problem.unfused)}


def compiled_run(fn, *args, **patch):
    """(output, eager output, graph reports, dispatch count of a steady-state call)."""
    torch._dynamo.reset()
    with tilewright.config.patch(**patch), collect_reports() as reports:
        c = torch.compile(fn, backend="tilewright", fullgraph=True)
        out = c(*args)
        c(*args)
        with counting(reports) as n:
            c(*args)
    return out, fn(*args), reports, n


# -- one native op ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm"])
def test_a_kernel_that_is_one_native_op_keeps_that_op(name, fresh_cache):
    fn = {"softmax": lambda x, w, b: torch.softmax(x, -1), "log_softmax": lambda x, w, b: F.log_softmax(x, -1),
          "layer_norm": lambda x, w, b: F.layer_norm(x, (24,), w, b)}[name]
    args = (g(6, 24), g(24, seed=2), g(24, seed=3))
    (problem,) = problems_of(fn, *args)
    assert is_native(problem), json.loads(problem.unfused)
    # the program is right: against the float64 reference, outputs poisoned first
    _, _, got, ref = run_candidate(problem, f"aten.unfused_{problem.kind}", program_params(problem))
    assert rel_err(got[0], ref[0]) < 1e-5
    # and compiled, the tuner keeps it over the torch form: one ATen call per call of the graph
    # (ATen's candidates only: a C++ kernel may beat both, which is another test's business)
    out, want, reports, n = compiled_run(fn, *args, force_backend="aten")
    assert rel_err(out, want) < 1e-5
    (k,) = reports[0].kernels
    assert k.winner.startswith(f"aten.unfused_{problem.kind}"), k.reason
    assert reports[0].aten_dispatches == 1, n.per_op


def test_a_native_op_inside_a_larger_kernel_is_collapsed_to_its_call():
    # LayerNorm then GELU: one kernel; its program calls layer_norm natively, then gelu
    (problem,) = problems_of(lambda x, w, b: F.gelu(F.layer_norm(x, (24,), w, b)),
                             g(6, 24), g(24, seed=2), g(24, seed=3))
    prog = json.loads(problem.unfused)
    assert not is_native(problem) and prog["native"] == ["aten.native_layer_norm.default"]
    assert [s["op"] for s in prog["steps"]] == ["aten.native_layer_norm.default", "getitem", "aten.gelu.default"]
    _, _, got, ref = run_candidate(problem, f"aten.unfused_{problem.kind}", program_params(problem))
    assert rel_err(got[0], ref[0]) < 1e-5


# -- the choice is recorded and re-used --------------------------------------------------------------
def test_unfused_vs_fused_choice_is_recorded_in_the_cache_and_reused(fresh_cache, monkeypatch):
    def fn(x, y):
        return (x * y + 1.0).sum(-1) * 0.5

    x, y = g(8, 32), g(8, 32, seed=1)
    evaluated = []
    real = select_mod.evaluate
    monkeypatch.setattr(select_mod, "evaluate", lambda task, *a, **k: evaluated.append(task) or real(task, *a, **k))
    out, want, reports, _ = compiled_run(fn, x, y)
    assert rel_err(out, want) < 1e-5
    (k,) = reports[0].kernels
    # the ops as they were and the torch form, both measured (and the C++ kernels beside them)
    assert {"aten.reduction", "aten.unfused_reduction"} <= {t.candidate.template_id for t in evaluated}
    # the cache holds a record for each, under its own candidate key
    entries = TuningCache(fresh_cache / "autotune" / "tuning.json").entries()
    keys = {ck.split("@")[0] for _, e in entries for ck in e["records"]}
    assert {"aten.reduction", "aten.unfused_reduction"} <= keys
    # a second compile measures nothing and makes the same choice
    evaluated.clear()
    out2, _, reports2, _ = compiled_run(fn, x, y)
    assert evaluated == []
    assert reports2[0].kernels[0].winner == k.winner
    assert torch.equal(out, out2)


# -- values that read no memory ------------------------------------------------------------------------
def _index_heavy(x):
    # positions (an iota), a mask from them and a pad: index-only values around one load
    pos = torch.arange(x.shape[-1], dtype=torch.float32)
    return F.pad(x * torch.cos(pos * 0.1), (1, 1)) + 1.0


@pytest.mark.parametrize("template", ["torch form", "unfused"])
def test_index_only_values_are_computed_once_per_shape(template):
    x = g(4, 16)
    (problem,) = problems_of(_index_heavy, x)
    tid = f"aten.{problem.kind}" if template == "torch form" else f"aten.unfused_{problem.kind}"
    params = {} if template == "torch form" else program_params(problem)
    launch, inputs, got, ref = run_candidate(problem, tid, params)
    assert rel_err(got[0], ref[0]) < 1e-5
    calls = []
    for _ in range(2):
        with counting() as n:
            launch(*inputs.tensors, *inputs.sizes)
        calls.append(n.per_op)
    # the first call above was the check; both counted calls find the kept values
    assert calls[0] == calls[1]
    assert not {"aten::arange", "aten::cos"} & set(calls[0]), calls[0]
    # a new shape computes them again, once
    (problem2,) = problems_of(_index_heavy, g(4, 20))
    launch2, inputs2, got2, ref2 = run_candidate(problem2, tid, {} if template == "torch form" else
                                                 program_params(problem2), seed=2)
    assert rel_err(got2[0], ref2[0]) < 1e-5


# -- casts that change nothing ------------------------------------------------------------------------
class GPT2Block(torch.nn.Module):
    """GPT-2's block: pre-LayerNorm attention and MLP (GELU tanh), residuals, fp32."""

    def __init__(self, d: int = 32, heads: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, S, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
        x = x + self.proj(a)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


@pytest.fixture(scope="module")
def gpt2_runs():
    """The block compiled twice: autotune off (the torch forms run: the policy's rank 0) and
    on (the tuner's choice), each with its steady-state ATen calls per op."""
    block, x = GPT2Block().eval(), g(2, 8, 32)
    runs = {}
    with torch.no_grad():
        torch.set_num_threads(1)
        for mode, patch in (("torch form", {"autotune": False}), ("tuned", {})):
            runs[mode] = compiled_run(block, x, **patch)
        with counting() as eager:
            block(x)
    return runs, eager


def test_no_op_casts_are_gone_from_a_gpt2_block(gpt2_runs):
    runs, eager = gpt2_runs
    for mode, (out, want, reports, n) in runs.items():
        assert rel_err(out, want) < 1e-5, mode
        # fp32 throughout: not one conversion (the torch form used to make one per load)
        assert n.per_op["aten::to"] == 0 and n.per_op["aten::_to_copy"] == 0, (mode, n.per_op)
    # the tuner's choice makes about eager's ATen calls (eager's Linear is one call where the
    # graph has a transpose, a view and a GEMM)
    tuned = runs["tuned"][3]
    assert tuned.total <= eager.total + 3 * 6, (tuned.per_op, eager.per_op)
    assert runs["torch form"][3].total > tuned.total


def test_dispatch_counts_reach_the_graph_report(gpt2_runs):
    runs, _ = gpt2_runs
    _, _, reports, n = runs["tuned"]
    assert len(reports) == 1 and reports[0].aten_dispatches == n.per_graph[reports[0].graph_id] > 0
    assert "aten_dispatches" in reports[0].to_json()


# -- the policy -------------------------------------------------------------------------------------
def test_cpu_policy_offers_every_template_that_runs_compiled_there(cpu):
    (problem,) = problems_of(lambda x: torch.softmax(x, -1), g(4, 16))

    class CompiledOnCpu:  # what a C++ loop-kernel template declares
        id, backend, op, compiled_on_cpu = "cpp.reduction", "cpp", "reduction", True
        source_hash = "0" * 16
        space = get_template("aten.reduction").space

        def supports(self, problem, target):
            return True

        def check(self, params, problem, target):
            return None

        def seed_params(self, problem, target):
            return [{}]

    class Interpreted(CompiledOnCpu):
        id, backend, compiled_on_cpu = "triton.reduction", "triton", False

    assert offered_on(CompiledOnCpu(), cpu) and not offered_on(Interpreted(), cpu)
    cands = LoopPolicy("reduction").candidates(problem, cpu, templates=[CompiledOnCpu(), Interpreted()])
    ids = [c.template_id for c in cands]
    assert ids == ["aten.unfused_reduction", "aten.reduction", "cpp.reduction"], ids
    assert [c.rank for c in cands] == [0, 1, 2]
    with tilewright.config.patch(autotune=False):  # rank 0 runs unchecked then: the torch form
        assert LoopPolicy("reduction").candidates(problem, cpu)[0].template_id == "aten.reduction"


def test_programs_are_not_part_of_the_problem_key():
    # the same kernel from two op sequences is one problem; the candidate key tells them apart
    import dataclasses

    from tilewright.autotune.cache import ProblemKey

    (a,) = problems_of(lambda x: torch.softmax(x, -1), g(4, 16))
    b = dataclasses.replace(a, unfused="")
    assert a.unfused and a == b and a.stable_hash() == b.stable_hash()
    assert ProblemKey.for_problem(a, "cpu").digest == ProblemKey.for_problem(b, "cpu").digest
    assert LoopProblem.from_json(a.to_json()).unfused == a.unfused  # carried through the cache
    assert Counter(json.loads(a.unfused)["outputs"])  # well-formed


# -- a kept (static) value never reads one computed per call -------------------------------------------
def _arange_output_then_read(x):
    # an iota that is an output (never kept: a caller may write into it) read by views that
    # read no input: those were kept and ran before it was defined (NameError: v1)
    p = torch.arange(x.shape[0]) + 0
    q = p.unsqueeze(0).expand(2, -1)[:, 0:1] - 1
    return p, q, x.sum()


def _positions_scale(x):
    # position ids (an output) scaling the rows, as a rotary/position-id kernel does
    pos = torch.arange(x.shape[-1]) + 0
    return pos, (x * pos.unsqueeze(0).expand(x.shape[0], -1).to(x.dtype)).sum(-1)


@pytest.mark.parametrize("fn,shape", [(_arange_output_then_read, (13,)), (_positions_scale, (3, 13))])
def test_unfused_candidate_defines_every_value_before_reading_it(fn, shape, fresh_cache):
    x = g(*shape)
    problems = [p for p in problems_of(fn, x) if p.unfused]
    assert problems
    for problem in problems:
        prog = json.loads(problem.unfused)
        static = set(prog["static"])
        for j in static:  # the kept steps are closed: each reads kept values only
            step = json.dumps(prog["steps"][j])
            assert all(f'{{"v": {v}}}' not in step for v in range(len(prog["steps"])) if v not in static)
        _, _, got, ref = run_candidate(problem, f"aten.unfused_{problem.kind}", program_params(problem))
        for o, r in zip(got, ref):
            assert rel_err(o, r) < 1e-5
    # compiled, on a non-contiguous input too: right, and no candidate failed on its own code
    for arg in (x, g(*shape[:-1], 2 * shape[-1])[..., ::2]):
        out, want, _, _ = compiled_run(fn, arg)
        for o, w in zip(out, want):
            assert o.dtype == w.dtype and rel_err(o, w) < 1e-5
    reasons = [r.get("reason") or "" for _, e in TuningCache(fresh_cache / "autotune" / "tuning.json").entries()
               for r in e["records"].values()]
    assert reasons and not [r for r in reasons if "NameError" in r or "SyntaxError" in r], reasons


def test_a_candidate_whose_code_is_broken_is_a_warning_in_strict_mode(caplog):
    from tilewright.autotune.evaluate import _failed

    base = dict(template_id="aten.unfused_reduction", template_hash="h", params={"program": "p"},
                rank=0, predicted_ms=None)
    with tilewright.config.patch(strict=True), caplog.at_level("WARNING", "tilewright.autotune.evaluate"):
        out = _failed(base, "run", NameError("name 'v1' is not defined"))
        _failed(base, "run", RuntimeError("shape mismatch"))  # the problem's failure: no warning
    assert out.record.status == "failed" and "NameError" in out.record.reason
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "aten.unfused_reduction" in msg and "template bug" in msg and "v1" in msg
