"""The problem-kind registry (tilewright.kinds): every registered kind's problems round-trip
through JSON and hash stably (each field changes the hash), an unknown kind is a clear error, and
the worked example of docs/kernel-authors.md ("Adding a problem kind"): a toy kind, ``axpy``
(``out = alpha * x + y``), registered from this module (outside the package) with its own
ATen-style template and a Triton one, chosen through ``select`` (checked against its float64
reference, outputs poisoned), round-tripped through JSON and the tuning cache's key, and planned
by ``tilewright aot``'s plan step."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pytest
import torch

import tilewright
from tilewright import templates
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.cost_model import CostEstimate
from tilewright.kinds import (
    ProblemKind, UnknownKindError, get_kind, kind_names, kind_of, kinds, problem_from_json, register_kind,
    unregister_kind,
)
from tilewright.runtime.aot import AotSpec
from tilewright.runtime.targets import Target, get_target
from tilewright.templates import (
    SUPPORTED, Knob, ParamSpace, RenderedKernel, Support, TemplateSpec, get_template, templates_for,
)

# fields that cannot vary in an example: one legal value so far
SINGLE_VALUED = {"grouped_gemm": {"offsets"}}


# -- the registry -------------------------------------------------------------------------------
def _fields(p: Any) -> dict[str, Any]:
    return {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}


@pytest.mark.parametrize("kind", kinds(), ids=lambda k: k.name)
def test_every_kind_round_trips_json_and_each_field_changes_its_hash(kind: ProblemKind):
    examples = kind.examples()
    assert len(examples) > 1, f"{kind!r} gives no examples (ProblemKind.examples)"
    base, varied = examples[0], set()
    for p in examples:
        assert kind_of(p) is kind
        text = json.dumps(p.to_json())  # JSON, not just a dict
        back = problem_from_json(json.loads(text))
        assert back == p and back.stable_hash() == p.stable_hash()
        assert p.stable_hash() == type(p).from_json(p.to_json()).stable_hash()  # stable across copies
    for p in examples[1:]:
        changed = {k for k, v in _fields(p).items() if _fields(base)[k] != v}
        assert changed, f"{p} repeats the first example"
        varied |= changed
        assert p.to_json() != base.to_json()
        if changed - set(kind.display_fields):
            assert p.stable_hash() != base.stable_hash(), f"changing {changed} keeps the hash"
    missing = set(_fields(base)) - varied - SINGLE_VALUED.get(kind.name, set())
    assert not missing, f"{kind!r}: no example varies {sorted(missing)}"


def test_the_registry_knows_the_built_in_kinds_in_order():
    assert [k.names for k in kinds()[:3]] == [("gemm",), ("grouped_gemm",), ("pointwise", "reduction")]
    assert get_kind("reduction") is get_kind("pointwise")


def test_unknown_kind_json_is_a_clear_error():
    with pytest.raises(UnknownKindError) as e:
        problem_from_json({"kind": "scan", "B": 1})
    text = str(e.value)
    assert "'scan'" in text and "gemm" in text and "register_kind" in text
    assert isinstance(e.value, KeyError)  # the cache treats a key it cannot read as a miss


def test_gemm_json_without_a_kind_is_a_gemm():
    """Tuning caches hold GEMM problems without a "kind": they stay readable."""
    p = get_kind("gemm").examples()[0]
    assert "kind" not in p.to_json() and problem_from_json(p.to_json()) == p


def test_a_kind_with_a_taken_name_or_no_problem_type_is_refused():
    class Twin(ProblemKind):
        names = ("gemm",)
        problem_type = AxpyProblem

    class Bare(ProblemKind):
        names = ("bare",)

    with pytest.raises(ValueError, match="already registered"):
        register_kind(Twin())
    with pytest.raises(ValueError, match="problem_type"):
        register_kind(Bare())


# -- the worked example: a toy kind from outside the package --------------------------------------
@dataclass(frozen=True)
class AxpyProblem:
    """``out = alpha * x + y`` over ``n`` elements of ``dtype`` (x, y, out contiguous)."""

    n: int
    dtype: str = "fp32"
    alpha: float = 2.0
    dynamic: frozenset[str] = field(default_factory=frozenset)
    op: str = "axpy"  # display only

    kind = "axpy"  # the kind's name: a class attribute, not a field

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "dynamic": sorted(self.dynamic), "kind": self.kind}

    @classmethod
    def from_json(cls, d: dict) -> "AxpyProblem":
        d = {k: v for k, v in d.items() if k != "kind"}
        return cls(**{**d, "dynamic": frozenset(d.get("dynamic", ()))})

    def stable_hash(self) -> str:
        d = {k: v for k, v in self.to_json().items() if k != "op"}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        return f"{self.op} n={self.n} {self.dtype} alpha={self.alpha}"

    def with_sizes(self, **sizes: int) -> "AxpyProblem":
        return dataclasses.replace(self, **sizes)

    @property
    def min_bytes(self) -> int:
        return 3 * self.n * torch.finfo(_TORCH[self.dtype]).bits // 8


_TORCH = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class AxpyInputs:
    x: torch.Tensor
    y: torch.Tensor


class AtenAxpy(TemplateSpec):
    """The fallback and, in float64, the reference: PyTorch operators."""

    id = "aten.axpy"
    backend = "aten"
    op = "axpy"

    def problem_support(self, problem: Any, target: Target) -> Support:
        return SUPPORTED if isinstance(problem, AxpyProblem) else Support(False, "axpy problems only")

    def render_kernel(self, problem: AxpyProblem, params: Mapping[str, Any], target: Target) -> RenderedKernel:
        source = (f"ALPHA = {problem.alpha!r}\n\n"
                  "def launch(x, y, out=None):\n"
                  "    r = ALPHA * x.to(out.dtype if out is not None else x.dtype) + y\n"
                  "    return r if out is None else out.copy_(r)\n")
        return RenderedKernel(self.id, {}, target.name, source, "aten_axpy")


TRITON_AXPY = '''
import torch
import triton
import triton.language as tl


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, n, ALPHA: tl.constexpr, XBLOCK: tl.constexpr):
    offs = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (ALPHA * x + y).to(out_ptr.dtype.element_ty), mask=mask)


def launch(x, y, out=None):
    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    axpy_kernel[(triton.cdiv(n, {XBLOCK}),)](x, y, out, n, ALPHA={ALPHA}, XBLOCK={XBLOCK}, num_warps={num_warps})
    return out
'''


class TritonAxpy(TemplateSpec):
    """A generated kernel: ``XBLOCK`` elements per program."""

    id = "triton.axpy"
    backend = "triton"
    op = "axpy"
    space = ParamSpace((Knob("XBLOCK", (64, 256, 1024), 1024, "elements per program"),
                        Knob("num_warps", (1, 2, 4), 4, "warps per program")))

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, AxpyProblem):
            return Support(False, "axpy problems only")
        return SUPPORTED if target.triton is not None or target.interpreted else Support(False, "no Triton")

    def render_kernel(self, problem: AxpyProblem, params: Mapping[str, Any], target: Target) -> RenderedKernel:
        p = self.space.complete(params)
        source = TRITON_AXPY.format(ALPHA=problem.alpha, **p)
        aot = AotSpec("axpy_kernel", "triton", {"x_ptr": f"*{problem.dtype}", "y_ptr": f"*{problem.dtype}",
                                                "out_ptr": f"*{problem.dtype}"},
                      {"ALPHA": problem.alpha, "XBLOCK": p["XBLOCK"]}, ("x_ptr", "y_ptr", "out_ptr"),
                      {"num_warps": p["num_warps"], "num_stages": 1})
        return RenderedKernel(self.id, p, target.name, source, f"triton_axpy_x{p['XBLOCK']}",
                              interpret=target.interpreted, aot=aot)


class AxpyPolicy:
    """ATen first (rank 0); then each generated template's settings by predicted time (only when
    forced on an interpreted target: an interpreter cannot beat ATen)."""

    def __init__(self, kind: "AxpyKind"):
        self.kind = kind

    def ranked(self, problem: AxpyProblem, target: Target, template: TemplateSpec) -> list[tuple[float, dict]]:
        seeds = [{"XBLOCK": 1024, "num_warps": 4}, {"XBLOCK": 256, "num_warps": 2}]
        legal = [template.space.complete(p) for p in seeds if template.check(p, problem, target) is None]
        return sorted(((self.kind.estimate(problem, p, target, template).ms, p) for p in legal),
                      key=lambda item: item[0])

    def candidates(self, problem: AxpyProblem, target: Target) -> list[Candidate]:
        aten = get_template("aten.axpy")
        out = [Candidate.of(aten.id, aten.source_hash, {}, rank=0)]
        if target.interpreted and tilewright.config.force_backend == "auto":
            return out
        for t in templates_for("axpy", target.backend, jit=True):
            if t.backend != "aten" and t.supports(problem, target):
                for ms, p in self.ranked(problem, target, t):
                    out.append(Candidate.of(t.id, t.source_hash, p, rank=len(out), predicted_ms=ms))
        return out


class AxpyKind(ProblemKind):
    names = ("axpy",)
    problem_type = AxpyProblem

    def examples(self) -> list[AxpyProblem]:
        base = AxpyProblem(1000)
        return [base, AxpyProblem(999), AxpyProblem(1000, "bf16"), AxpyProblem(1000, alpha=0.5),
                AxpyProblem(1000, dynamic=frozenset({"n"})), AxpyProblem(1000, op="saxpy")]

    def policy(self, name: str, target: Target) -> AxpyPolicy:
        return AxpyPolicy(self)

    def estimate(self, problem: AxpyProblem, params: Mapping[str, Any], target: Target, template: Any) -> CostEstimate:
        programs = math.ceil(problem.n / params["XBLOCK"])
        ms = problem.min_bytes / ((target.hbm_gbps or 1.0) * 1e6) + 1e-3 * programs / max(target.num_sms, 1)
        return CostEstimate(ms, 0.0, ms, "memory", programs / max(target.num_sms, 1), 1.0)

    def make_inputs(self, problem: AxpyProblem, device: Any, seed: int = 0) -> AxpyInputs:
        gen = torch.Generator().manual_seed(seed)
        x, y = (torch.randn(problem.n, generator=gen).to(device, _TORCH[problem.dtype]) for _ in range(2))
        return AxpyInputs(x, y)

    def poisoned(self, problem: AxpyProblem, device: Any) -> torch.Tensor:
        return torch.full((problem.n,), float("nan"), dtype=_TORCH[problem.dtype], device=device)

    def run(self, launch, x: AxpyInputs, out: torch.Tensor) -> torch.Tensor:
        return launch(x.x, x.y, out=out)

    def error(self, problem: AxpyProblem, result: torch.Tensor, ref: torch.Tensor, tf32: bool) -> tuple[float, float]:
        r = ref.double()
        err = (result.double() - r).norm().item() / r.norm().item()
        return (err if math.isfinite(err) else float("inf")), {"fp32": 1e-5, "fp16": 1e-2, "bf16": 2e-2}[problem.dtype]

    def reference(self, problem: AxpyProblem, x: AxpyInputs, factory: Any) -> torch.Tensor:
        aten = get_template(self.aten_template_id(problem))
        launch = factory.build(problem, Candidate.of(aten.id, aten.source_hash), get_target("cpu"))
        return launch(x.x.double(), x.y.double())

    def call_sizes(self, problem: AxpyProblem, args: tuple) -> dict[str, int]:
        return {"n": args[0].numel()} if problem.dynamic else {}


@pytest.fixture
def axpy(monkeypatch):
    """The toy kind and its two templates registered, as a plug-in would (then removed)."""
    added = [templates.register_template(t) for t in (AtenAxpy(), TritonAxpy())]
    kind = register_kind(AxpyKind())
    yield kind
    unregister_kind(kind)
    for t in added:
        templates.unregister_template(t.id)


def test_toy_kind_round_trips_through_json_and_the_cache_key(axpy):
    from tilewright.autotune.cache import ProblemKey

    p = AxpyProblem(1000, alpha=0.5)
    assert problem_from_json(json.loads(json.dumps(p.to_json()))) == p
    key = ProblemKey.for_problem(p, "cpu")
    assert ProblemKey.from_entry(key.to_json()) == key
    # the display label stays out of the cache key
    assert ProblemKey.for_problem(dataclasses.replace(p, op="saxpy"), "cpu").digest == key.digest


def test_toy_kind_is_chosen_through_select(axpy, tmp_path):
    """ATen alone on the CPU (untimed); with Triton forced, the interpreted kernel is built,
    run into a NaN-poisoned output, checked against the float64 reference and timed."""
    from tilewright.autotune.select import select
    from tilewright.compiler.kernel_factory import default_factory

    cpu = get_target("cpu")
    p = AxpyProblem(1000)
    with tilewright.config.patch(cache_dir=str(tmp_path)):
        sel = select(p, cpu, default_factory)
        assert sel.winner.template_id == "aten.axpy" and not sel.measured
        with tilewright.config.patch(force_backend="triton"):
            sel = select(p, cpu, default_factory)
    assert sel.winner.template_id == "triton.axpy" and sel.measured, sel.reason
    # checked against float64 (a slow second setting may be aborted after its checked first run)
    assert all(r.record.status in ("ok", "aborted") and r.record.rel_err < 1e-6 for r in sel.results)
    x = axpy.make_inputs(p, "cpu", seed=1)
    out = default_factory.build(p, sel.winner, cpu)(x.x, x.y)
    torch.testing.assert_close(out, 2.0 * x.x + x.y)


def test_a_wrong_toy_kernel_is_caught_by_its_check(axpy, tmp_path, monkeypatch):
    """A kernel that forgets ``+ y`` fails its check against the float64 reference: with Triton
    forced nothing is left, which the pipeline answers by running that kernel on ATen."""
    from tilewright.autotune.select import select
    from tilewright.errors import NoValidCandidateError
    from tilewright.compiler.kernel_factory import default_factory

    monkeypatch.setitem(globals(), "TRITON_AXPY", TRITON_AXPY.replace("(ALPHA * x + y)", "(ALPHA * x)"))
    with tilewright.config.patch(cache_dir=str(tmp_path), force_backend="triton"), \
            pytest.raises(NoValidCandidateError, match="relative error"):
        select(AxpyProblem(777, alpha=3.0), get_target("cpu"), default_factory)


def test_toy_kind_is_planned_by_aot(axpy):
    """``tilewright aot``'s plan step: the kind's policy ranks the Triton template's settings, its
    cost model estimates them, its label names the kernel; the render carries its AotSpec."""
    from tilewright.compiler import aot
    from tilewright.compiler.capture import CapturedKernel

    p = AxpyProblem(1 << 20, "bf16")
    kernels, refused = aot.plan([CapturedKernel(p, ["inference.axpy_0"])], [get_target("sm_90a")])
    assert not refused and len(kernels) == 1
    (k,) = kernels
    assert k.kind == "axpy" and k.template.id == "triton.axpy" and k.bound == "memory"
    assert k.name.startswith("sm_90a/axpy_") and k.name.endswith("-triton_axpy-x1024-w4")
    assert k.job.spec["kernel"] == "axpy_kernel" and k.job.spec["pointer_types"]["x_ptr"] == "*bf16"
    assert aot.describe_problem(p) == p.describe()


def test_entry_point_kinds_are_registered_and_a_broken_one_is_skipped(monkeypatch, caplog):
    import logging

    import tilewright.kinds as registry

    class EntryPoint:
        def __init__(self, name, load):
            self.name, self.value, self.load = name, f"tests.{name}:KIND", load

    def broken():
        raise ImportError("no module named mypackage")
    monkeypatch.setattr(registry, "entry_points", lambda group: [
        EntryPoint("axpy", lambda: AxpyKind), EntryPoint("broken", broken)] if group == "tilewright.kinds" else [])
    with caplog.at_level(logging.WARNING, logger="tilewright.kinds"):
        added = registry._load_entry_points()
    try:
        assert [k.names for k in added] == [("axpy",)] and get_kind("axpy") is added[0]
        assert "broken" in caplog.text and "no module named mypackage" in caplog.text
    finally:
        for k in added:
            unregister_kind(k)
    with pytest.raises(UnknownKindError):
        get_kind("axpy")


# the shared code that asks the kinds and must name none: every module of compiler/ and autotune/
# (a kind's own code lives in its folder, tilewright/kinds/<kind>/), and the other junctions
_PKG = Path(tilewright.__file__).parent
SHARED = tuple(sorted(str(f.relative_to(_PKG)) for d in ("compiler", "autotune") for f in (_PKG / d).rglob("*.py"))) + (
    "kernels/build.py", "cli/warm.py")
KIND_NAMES = {"gemm", "grouped_gemm", "pointwise", "reduction", "attention", "loop"}
KIND_TYPES = {"GemmProblem", "LoopProblem", "GroupedGemmProblem", "AttentionProblem", "GemmPolicy", "LoopPolicy",
              "GroupedGemmPolicy", "AttentionPolicy", "GemmNode", "GemmReport"}
# every kind's code has moved into its folder (issue 30): the shared code names no kind
ALLOWED: dict[str, set[str]] = {
}


def test_kind_names_list_every_registered_kind():
    """The list the next test looks for holds every registered kind's names."""
    assert set(kind_names()) <= KIND_NAMES


@pytest.mark.parametrize("path", SHARED)
def test_shared_code_names_no_problem_kind(path):
    """A new kind is its own folder plus one registration: the shared code never lists kinds
    (docstrings and comments may mention them)."""
    import ast

    tree = ast.parse((_PKG / path).read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    named = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings and n.value in KIND_NAMES:
            named.add(n.value)
        elif isinstance(n, ast.Name) and n.id in KIND_TYPES or isinstance(n, ast.alias) and n.name in KIND_TYPES:
            named.add(getattr(n, "id", None) or n.name)
    assert not named - ALLOWED.get(path, set()), f"{path} names {sorted(named)}: ask tilewright.kinds"


def test_aten_calls_left_as_they_are_are_labelled_by_their_kind():
    """lower() names no kind: an ATen call no kind lowered is labelled by the kind whose op it is
    (ProblemKind.extern_label), else "view", "getitem" or "extern"."""
    import operator

    import torch.fx as fx

    from tilewright.compiler.lower import _kind

    aten = torch.ops.aten
    g = fx.Graph()
    x = g.placeholder("x")
    registered = kinds()
    cases = {aten.exp.default: "pointwise", aten._softmax.default: "reduction",
             aten._scaled_dot_product_flash_attention_for_cpu.default: "attention",
             aten.view.default: "view", operator.getitem: "getitem", aten.sort.default: "extern"}
    for target, label in cases.items():
        assert _kind(g.call_function(target, (x,)), registered) == label, target
    # a kind registered from outside labels its own ops
    toy = register_kind(type("Toy", (ProblemKind,), {
        "names": ("toy_label",), "problem_type": AxpyProblem,
        "extern_label": lambda self, node: "toy" if node.target is aten.sort.default else None})())
    try:
        assert _kind(g.call_function(aten.sort.default, (x,)), kinds()) == "toy"
    finally:
        unregister_kind(toy)


def test_gemm_lowering_and_fusion_are_the_gemm_kinds_hooks(monkeypatch):
    """compiler/ names no GEMM op: lowering asks the kinds (``GemmKind.lower`` makes the
    GemmNode), the fuse stage asks every kind (``GemmKind.fuse`` absorbs the relu, a kind
    registered from outside is asked too), and a GEMM lowering that raises costs that node only:
    it stays an ATen call."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tilewright.compiler.graph import ExternNode
    from tilewright.compiler.lower import lower
    from tilewright.compiler.pipeline import fuse, fusing_for
    from tilewright.kinds.gemm import lower as gemm_lower
    from tilewright.runtime.targets import get_target

    gm = make_fx(lambda a, b: torch.relu(torch.mm(a, b)))(torch.randn(8, 16), torch.randn(16, 4))
    kg = lower(gm)
    (g,) = kg.gemms
    assert (g.name, g.op, g.epilogue) == ("gemm_0", "mm", [])
    asked = []
    toy = register_kind(type("FuseToy", (ProblemKind,), {
        "names": ("fuse_toy",), "problem_type": AxpyProblem,
        "fuse": lambda self, kg, gm: asked.append(kg) or 0})())
    try:
        with fusing_for(get_target("cuda:sm_90a")):  # a CPU GEMM leaves its relu to a loop kernel
            fuse(kg, gm)
    finally:
        unregister_kind(toy)
    assert asked == [kg] and [op.kind for op in g.epilogue] == ["relu"] and len(g.fx_nodes) == 2

    def broken(node, index):
        raise RuntimeError("injected GEMM lowering failure")
    monkeypatch.setattr(gemm_lower, "lower_gemm", broken)
    with tilewright.config.patch(strict=False), \
            pytest.warns(RuntimeWarning, match="injected GEMM lowering failure"):
        kg = lower(gm)
    assert not kg.gemms
    assert [n.fx_node.target for n in kg.nodes if isinstance(n, ExternNode)] == [
        torch.ops.aten.mm.default, torch.ops.aten.relu.default]


def test_the_fuse_stage_asks_every_kind_to_schedule():
    """A kind groups its own lowered nodes into kernels (ProblemKind.schedule): the fuse stage
    asks every registered kind, one from outside the package too; the loop kind's fusion
    scheduler makes one kernel of exp, add and sum."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tilewright.compiler.decompositions import decomposition_table
    from tilewright.compiler.graph import FusedNode
    from tilewright.compiler.lower import lower
    from tilewright.compiler.pipeline import fuse

    asked = []
    toy = register_kind(type("Toy", (ProblemKind,), {
        "names": ("toy_schedule",), "problem_type": AxpyProblem,
        "schedule": lambda self, kg, gm: asked.append(kg) or 0})())
    try:
        gm = make_fx(lambda x: (x.exp() + 1).sum(-1), decomposition_table=decomposition_table(),
                     tracing_mode="fake")(torch.randn(4, 8))
        kg = lower(gm)
        with tilewright.config.patch(loop_kernels=True):
            fuse(kg, gm)
    finally:
        unregister_kind(toy)
    assert asked == [kg]
    assert sum(isinstance(n, FusedNode) for n in kg.nodes) == 1


def test_a_kinds_own_node_type_answers_the_shared_passes():
    """A kind whose kernels need a node type of their own (the GEMM kind's ``GemmNode``)
    subclasses ``compiler.graph.Node``: the graph, the wrapper, the traffic model and PDL's
    chains ask it (``launches_kernel``, ``produces``, ``describe``, ``wrapper_lines``) and never
    name it. A toy node here, outside the package: its kernel is called by the wrapper."""
    from typing import ClassVar

    import torch.fx as fx

    from tilewright.compiler.graph import KernelGraph, Node, produced
    from tilewright.compiler.pdl import chain_edges
    from tilewright.compiler.traffic import compiled_cost
    from tilewright.compiler.wrapper import WrapperCodegen, load_wrapper

    @dataclass
    class ToyNode(Node):
        out: str = ""
        launches_kernel: ClassVar[bool] = True

        @property
        def inputs(self) -> list[str]:
            return ["x"]

        def produces(self) -> list[str]:
            return [self.out]

        def describe(self) -> str:
            return f"{self.out} = {self.name}: toy(x)"

        def wrapper_lines(self, w) -> list[str]:
            return [f"{w.name(self.out)} = {self.name}({w.name('x')})"]

    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.neg, (x,))
    g.output(y)
    node = ToyNode("toy_0", [y], out=y.name)
    kg = KernelGraph([x], [node], g.output_node())
    assert kg.kernels == [node] and produced(node) == [y.name]
    assert f"{y.name} = toy_0: toy(x)" in kg.describe()
    assert compiled_cost(kg, {"toy_0": 123}) == (0, 123)
    assert chain_edges([node, ToyNode("toy_1", [y], out="z")]) == [("toy_0", "toy_1")]
    source = WrapperCodegen(kg, fx.GraphModule(torch.nn.Module(), g)).generate()
    call = load_wrapper(source, {"toy_0": lambda t: t * 3.0}, [])
    t = torch.randn(5, 7, dtype=torch.float64)
    torch.testing.assert_close(call([t]), t * 3.0, rtol=0, atol=0)
