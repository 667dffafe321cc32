"""The kernel authors' guide, run (docs/kernel-authors.md; issue 19, part 3).

A language and a jinja template written outside the package (``docs/examples/``, imported as a
user's own modules) register through the public calls; the template is then a measured
candidate in a compiled model (forced to its language, Triton interpreter, against float64),
its measurement is cached, and ``tilewright aot`` plans and builds it for sm_90a with its
instruction check. The guide quotes the example files verbatim.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import tilewright
from tilewright.compiler import aot
from tilewright.compiler.capture import ModelSpec
from tilewright.compiler.report import collect_reports
from tilewright.runtime.aot import compile_jobs
from tilewright.runtime.verify import verify
from tilewright.templates import templates_for, unregister_language, unregister_template

EXAMPLES = Path(__file__).parents[1] / "docs" / "examples"
GUIDE = Path(__file__).parents[1] / "docs" / "kernel-authors.md"


@pytest.fixture(scope="module")
def tutorial():
    """The example language and template, registered as a user's code would, removed after."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import tutorial_gemm

        template = tutorial_gemm.register()
        yield template
    finally:
        # both go: a language left registered would be sent to every later tuning worker,
        # which cannot import tutorial_language once the folder leaves sys.path
        unregister_template("tutorial.gemm")
        unregister_language("tutorial")
        sys.path.remove(str(EXAMPLES))


class Head(nn.Module):
    """A linear layer with bias and GELU: one GEMM whose epilogue fuses both."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(48, 40)

    def forward(self, x):
        return nn.functional.gelu(self.proj(x))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def test_the_registered_template_serves_its_language_only(tutorial):
    assert tutorial in templates_for("gemm", "cpu", jit=True)
    assert tutorial.language.name == "tutorial" and "tutorial" in tilewright._config.force_backends()
    assert not tutorial.problem_support(tutorial_problem(batched=True), tilewright_cpu())
    assert tutorial.source_hash  # its own module and jinja file, found outside the package


def tilewright_cpu():
    from tilewright.runtime.targets import get_target

    return get_target("cpu")


def tutorial_problem(**change):
    import dataclasses

    from tilewright.problem import GemmProblem

    return dataclasses.replace(GemmProblem(M=24, N=40, K=48, dtype="fp16", out_dtype="fp16", layout_b="col"),
                               **change)


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_a_template_from_outside_is_a_measured_candidate_in_a_compiled_model(tutorial, tmp_path, dtype, tol):
    torch.manual_seed(0)
    model = Head().to(dtype)
    x = torch.randn(24, 48, dtype=dtype)  # ragged: no size is a multiple of the 64-wide tiles
    with torch.no_grad(), collect_reports() as reports, tilewright.config.patch(
            force_backend="tutorial", cache_dir=str(tmp_path), strict=True):
        out = torch.compile(model, backend="tilewright")(x)
    with torch.no_grad():
        ref = Head().double()
        ref.load_state_dict(model.state_dict())
        expected = ref(x.double())
    assert out.dtype == dtype and rel_err(out, expected) < tol
    (gemm,) = [g for r in reports for g in r.gemms]
    assert gemm.winner.startswith("tutorial.gemm"), gemm
    measured = [c for c in gemm.candidates if c.name.startswith("tutorial.gemm")]
    assert measured and all(c.status == "ok" and c.rel_err is not None for c in measured), gemm.candidates
    # the choice is in the tuning cache, under the template's id and source hash
    cache = (tmp_path / "autotune" / "tuning.json").read_text()
    assert f"tutorial.gemm@{tutorial.source_hash}" in cache


def test_tilewright_aot_plans_and_builds_it_for_sm90a(tutorial, tmp_path):
    model = Head().to(torch.float16)
    spec = ModelSpec(model, (torch.randn(64, 48, dtype=torch.float16),), {}, "head")
    captured = aot.capture_kernels(spec)
    kernels, refused = aot.plan(captured, [aot.get_target("sm_90a")])
    mine = [k for k in kernels if k.template is tutorial]
    assert mine and all(k.job is not None for k in mine), refused
    root = tmp_path / "kernels"
    results = compile_jobs([k.job for k in mine], root, workers=1, timeout_s=300)
    assert all(r.ok for r in results), [r.error for r in results]
    for k, r in zip(mine, results):
        checks = tutorial.expected_instructions(k.captured.problem, k.params, k.target)
        assert checks, "the template promises its MMA instructions"
        v = verify({stage: root / rel for stage, rel in r.artifacts.items()}, checks)
        assert v.ok, v.failures


@pytest.mark.slow
def test_the_whole_aot_build_lists_it_verified(tutorial, tmp_path):
    spec = ModelSpec(Head().to(torch.float16), (torch.randn(64, 48, dtype=torch.float16),), {}, "head")
    report = aot.build(spec, ["sm_90a"], tmp_path, workers=2)
    mine = [k for k in report.kernels if k.template is tutorial]
    assert mine and all(k.result.ok and k.verified for k in mine)


def test_the_guide_quotes_the_example_files_verbatim():
    guide = GUIDE.read_text()
    for name in ("tutorial_language.py", "tutorial_gemm.py", "tutorial_gemm.py.jinja", "helion_linear_gelu.py",
                 "helion_relu_squared.py", "tutorial_attention.py", "tutorial_attention.py.jinja"):
        block = re.search(rf"<!-- file: docs/examples/{re.escape(name)} -->\n```\w*\n(.*?)```", guide, re.S)
        assert block, f"docs/kernel-authors.md does not show docs/examples/{name}"
        assert block.group(1) == (EXAMPLES / name).read_text(), f"the guide's copy of {name} is stale"


def test_tuning_workers_see_templates_registered_by_calls(tutorial, tmp_path):
    # bug guarded: a spawned tuning worker starts with only what a scan finds, so a template
    # registered from user code was "no template 'tutorial.gemm'" there (isolation is on by
    # default on GPUs); the pool now replays the parent's registrations in each worker
    import pickle

    from tilewright.templates import registered_by_calls

    sent = [pickle.loads(blob) for blob in registered_by_calls()]
    assert any(getattr(o, "id", "") == tutorial.id for o in sent)
    assert any(getattr(o, "name", "") == "tutorial" for o in sent)
    torch.manual_seed(1)
    model = Head().to(torch.float16)
    x = torch.randn(24, 48, dtype=torch.float16)
    with torch.no_grad(), collect_reports() as reports, tilewright.config.patch(
            force_backend="tutorial", cache_dir=str(tmp_path), isolate="on", strict=True):
        out = torch.compile(model, backend="tilewright")(x)
    (gemm,) = [g for r in reports for g in r.gemms]
    assert gemm.winner.startswith("tutorial.gemm"), gemm
    with torch.no_grad():
        ref = Head().double()
        ref.load_state_dict(model.state_dict())
        assert rel_err(out, ref(x.double())) < 2e-3


def test_a_registration_a_worker_cannot_import_costs_only_itself(caplog):
    # bug guarded: the parent sent its registrations as one pickled list, so a template whose
    # module had left sys.path (this guide's fixture, torn down) killed every later tuning
    # worker before it was ready ("No module named 'tutorial_language'"), failing whole graphs
    import pickle
    import types

    from tilewright.templates import replay

    gone = types.ModuleType("tilewright_test_gone_module")
    exec("class Thing:\n    pass\n", gone.__dict__)
    gone.Thing.__module__ = gone.__name__
    sys.modules[gone.__name__] = gone
    try:
        blob = pickle.dumps(gone.Thing())
    finally:
        del sys.modules[gone.__name__]
    with caplog.at_level("WARNING", logger="tilewright"):
        replay([blob])
    assert "cannot be loaded in this worker" in caplog.text


# -- Adding a Helion template (docs/examples/helion_linear_gelu.py) ------------------------------
@pytest.fixture(scope="module")
def helion_example():
    """The example Helion kernel, registered through helion_template as a user's code would."""
    pytest.importorskip("helion")
    sys.path.insert(0, str(EXAMPLES))
    try:
        import helion_linear_gelu

        yield helion_linear_gelu.register()
    finally:
        unregister_template("helion.linear_gelu")
        sys.path.remove(str(EXAMPLES))


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_a_helion_kernel_from_outside_is_a_measured_cached_candidate(helion_example, tmp_path, monkeypatch,
                                                                      dtype, tol):
    torch.manual_seed(0)
    model = Head().to(dtype)
    x = torch.randn(24, 48, dtype=dtype)  # ragged for every block size

    def compile_and_run():
        torch._dynamo.reset()
        with torch.no_grad(), collect_reports() as reports, tilewright.config.patch(
                force_backend="helion", cache_dir=str(tmp_path), strict=True):
            out = torch.compile(model, backend="tilewright")(x)
        (gemm,) = [g for r in reports for g in r.gemms]
        return out, gemm

    out, gemm = compile_and_run()
    with torch.no_grad():
        ref = Head().double()
        ref.load_state_dict(model.state_dict())
        expected = ref(x.double())
    assert out.dtype == dtype and rel_err(out, expected) < tol
    mine = [c for c in gemm.candidates if c.name.startswith("helion.linear_gelu")]
    assert mine and all(c.status == "ok" and c.rel_err is not None for c in mine), gemm.candidates
    assert gemm.winner.startswith("helion."), gemm  # it and tilewright's own helion.gemm compete
    cache = (tmp_path / "autotune" / "tuning.json").read_text()
    assert f"helion.linear_gelu@{helion_example.source_hash}" in cache

    # a second compilation measures nothing: every candidate's record is in the cache
    import tilewright.autotune.select as select_module

    def no_measuring(*args, **kwargs):
        raise AssertionError("a cached problem was measured again")
    monkeypatch.setattr(select_module, "evaluate", no_measuring)
    again, gemm2 = compile_and_run()
    assert gemm2.winner == gemm.winner and torch.equal(again, out)


class WideHead(nn.Module):
    """Linear + GELU at a size where the cost model ranks tensor-core tiles first."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(1024, 1024)

    def forward(self, x):
        return nn.functional.gelu(self.proj(x))


def test_tilewright_aot_builds_the_helion_kernel_for_every_triton_target(helion_example, tmp_path):
    spec = ModelSpec(WideHead().to(torch.float16), (torch.randn(1024, 1024, dtype=torch.float16),), {}, "wide")
    captured = aot.capture_kernels(spec)
    targets = [aot.get_target(a) for a in ("sm_90a", "sm_100a", "gfx950", "gfx1250")]
    kernels, refused = aot.plan(captured, targets)
    mine = [k for k in kernels if k.template is helion_example]
    assert {k.target.name for k in mine} == {t.name for t in targets}, refused
    root = tmp_path / "kernels"
    results = compile_jobs([k.job for k in mine], root, workers=2, timeout_s=300)
    found = {}
    for k, r in zip(mine, results):
        assert r.ok, (k.target.name, r.error)
        checks = helion_example.expected_instructions(k.captured.problem, k.params, k.target)
        v = verify({stage: root / rel for stage, rel in r.artifacts.items()}, checks)
        assert v.ok, (k.target.name, v.failures)
        found[k.target.arch] = " ".join(p for p, n in v.counts.items() if n)
    assert "wgmma" in found["sm_90a"] and "tcgen05" in found["sm_100a"], found
    assert "v_mfma" in found["gfx950"] and "v_wmma" in found["gfx1250"], found
