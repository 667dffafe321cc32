"""The first call: what was cut from it keeps its meaning (each check as strict, each memo
invalidated where its input changes), and the bench times it in a fresh process."""

from __future__ import annotations

import os
import time

import pytest
import torch

from tilewright.autotune import evaluate as ev
from tilewright.kinds.loop import loop_error


def _loop_error_masked(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The float rule of ``loop_error`` written the long way (masks on every path)."""
    o, r = out.double(), ref.double()
    finite = torch.isfinite(r)
    if not torch.equal(torch.isnan(o), torch.isnan(r)) or not torch.equal(o[torch.isinf(r)], r[torch.isinf(r)]):
        return float("inf")
    if (~torch.isfinite(o[finite])).any():
        return float("inf")
    num, den = (o[finite] - r[finite]).norm().item(), r[finite].norm().item()
    return num / den if den > 0 else num


def test_loop_error_without_masks_for_finite_references_is_the_masked_rule():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 33, generator=g, dtype=torch.float64)
    close = (ref + 1e-6 * torch.randn(64, 33, generator=g, dtype=torch.float64)).float()
    cases = [(close, ref), (torch.zeros(64, 33), torch.zeros(64, 33, dtype=torch.float64)),
             (torch.full((64, 33), 0.5), torch.zeros(64, 33, dtype=torch.float64))]
    for bad in (float("nan"), float("inf"), float("-inf")):
        o = close.clone()
        o[5, 7] = bad
        cases.append((o, ref))  # any non-finite output against a finite reference is wrong
    r = ref.clone()
    r[1, 2], r[3, 4] = float("nan"), float("-inf")
    o = r.float().clone()
    cases += [(o, r), (close, r)]  # the masked path: matched, and not matched
    huge = torch.tensor([1e200, 1.0, -3e180], dtype=torch.float64)  # a norm overflows: the exact rule
    cases += [(huge, huge), (huge * (1 + 1e-9), huge), (torch.tensor([1e200, float("nan"), 0.0]), huge)]
    for o, r in cases:
        want = _loop_error_masked(o, r)
        got = loop_error(o, r, "fp32")
        same_nan = got != got and want != want
        assert same_nan or got == want or abs(got - want) <= 1e-12 * max(1.0, abs(want)), (got, want)
    assert loop_error(cases[3][0], ref, "fp32") == float("inf")


def test_fingerprint_is_the_position_weighted_sum_across_chunks(monkeypatch):
    monkeypatch.setattr(ev, "_CHUNK", 5)  # several chunks and a ragged last one
    monkeypatch.setattr(ev, "_weight_cache", {})
    x = torch.arange(-7, 16, dtype=torch.int64)
    want = sum((2 * i + 1) * int(v) for i, v in enumerate(x.tolist())) % (1 << 64)
    assert ev.fingerprint(x) == (want,)
    y = x.clone()
    y[11] += 1
    assert ev.fingerprint(y) != ev.fingerprint(x)
    big = torch.full((40,), (1 << 62) + 3, dtype=torch.int64)  # wraps modulo 2^64 as before
    want = sum((2 * i + 1) * int(v) for i, v in enumerate(big.tolist())) % (1 << 64)
    assert ev.fingerprint(big) == (want,)


def test_each_candidate_gets_its_own_copy_of_the_special_inputs():
    """A kernel that writes into its special-value inputs fails, and the next candidate still
    runs on the values the reference was computed from."""
    from test_loop_kernels import loop_problems

    from tilewright.autotune.candidates import Candidate
    from tilewright.compiler.kernel_factory import TemplateKernelFactory
    from tilewright.runtime.targets import get_target
    from tilewright.templates import get_template

    (problem,) = loop_problems(lambda a: torch.exp(a) * 2, torch.randn(5, 37))
    factory = TemplateKernelFactory()
    t = get_template("aten.pointwise")
    good = factory.build(problem, Candidate.of(t.id, t.source_hash), get_target("cpu"))

    def scribbles(*args, outs):
        args[0].fill_(0.0)  # into its input: the result is exp(0) * 2 everywhere
        return good(*args, outs=outs)

    task = ev.EvalTask(problem, Candidate.of(t.id, t.source_hash), "cpu", "cpu")
    ev.forget_inputs()
    try:
        assert ev._special_values_wrong(task, factory, good) is None
        assert "special values" in (ev._special_values_wrong(task, factory, scribbles) or "")
        assert ev._special_values_wrong(task, factory, good) is None
    finally:
        ev.forget_inputs()


def test_a_loop_nodes_inputs_follow_its_body():
    from tilewright.compiler.graph import LoopNode
    from tilewright.ir import expr as E
    from tilewright.ir.index import var

    x0 = var("i", 0)
    node = LoopNode(name="v", fx_nodes=[], ranges=(), body=E.op("exp", E.load("a", (x0,), "fp32")))
    assert node.inputs == ["a"]
    node.inputs.append("mutated")  # callers get a copy
    assert node.inputs == ["a"]
    node.body = E.op("add", E.load("b", (x0,), "fp32"), E.load("c", (x0,), "fp32"))
    assert node.inputs == ["b", "c"]


def test_a_templates_render_sources_follow_an_edited_import(tmp_path):
    from tilewright.templates.base import _imported_render_modules, _module_file

    mod = tmp_path / "my_template.py"
    mod.write_text("from tilewright.ir import dtypes\n")
    first = _imported_render_modules({mod})
    assert _module_file("tilewright.ir.dtypes") in first
    time.sleep(0.01)
    mod.write_text("import tilewright.ir.index  # now another module\n")
    os.utime(mod, ns=(time.time_ns(), time.time_ns() + 10**9))
    second = _imported_render_modules({mod})
    assert _module_file("tilewright.ir.index") in second and second != first


def test_the_jinja_environment_is_shared_and_sees_edited_files(tmp_path):
    from tilewright.templates.base import jinja_env

    (tmp_path / "k.jinja").write_text("a {{ x }}")
    env = jinja_env(tmp_path)
    assert env is jinja_env(tmp_path)  # one per folder: a file is compiled once, not per render
    assert env.get_template("k.jinja").render(x=1) == "a 1"
    (tmp_path / "k.jinja").write_text("b {{ x }}")
    os.utime(tmp_path / "k.jinja", ns=(time.time_ns(), time.time_ns() + 10**9))
    assert env.get_template("k.jinja").render(x=1) == "b 1"


@pytest.mark.slow
def test_the_first_call_is_timed_in_a_fresh_process_without_our_compiler_loaded(tmp_path):
    from tilewright.perf.first_call import FirstCallError, first_call_s

    r = first_call_s("cpu-ci", "cpu.softmax", "eager", cpu_threads=1, cache_dir=tmp_path / "tw",
                     inductor_dir=tmp_path / "ind")
    assert r["first_call_s"] > 0 and r["cpu_s"] >= 0
    assert not [m for m in r["preloaded"] if m.startswith(("tilewright.compiler", "tilewright.autotune"))]
    with pytest.raises(FirstCallError, match="no case 'cpu.nothing'"):
        first_call_s("cpu-ci", "cpu.nothing", "eager", cpu_threads=1, cache_dir=tmp_path / "tw",
                     inductor_dir=tmp_path / "ind")


def test_a_cpp_candidate_prebuilt_in_the_background_is_the_library_its_module_loads(tmp_path, monkeypatch):
    """The tuner builds C++ candidates in background threads (``Language.prebuild``) while it
    makes inputs and references; the module loaded afterwards must find exactly that library,
    and the candidate is rendered once."""
    from test_loop_kernels import loop_problems

    from tilewright._config import config
    from tilewright.autotune.candidates import Candidate
    from tilewright.compiler.kernel_factory import TemplateKernelFactory
    from tilewright.runtime import cpp
    from tilewright.runtime.targets import get_target
    from tilewright.templates import get_template

    if cpp.unavailable_reason():
        pytest.skip(cpp.unavailable_reason())
    (problem,) = loop_problems(lambda a: torch.tanh(a) * 3 + a, torch.randn(6, 41))
    t, aten = get_template("cpp.pointwise"), get_template("aten.pointwise")
    cand = Candidate.of(t.id, t.source_hash, t.space.complete({}))
    factory = TemplateKernelFactory()
    renders = []
    real = factory.render
    monkeypatch.setattr(factory, "render", lambda *a: renders.append(a[1].template_id) or real(*a))
    with config.patch(cache_dir=str(tmp_path)):
        wait = factory.prepare(problem, [cand, Candidate.of(aten.id, aten.source_hash)], get_target("cpu"))
        wait()
        assert renders == ["cpp.pointwise"]  # ATen has nothing to build ahead
        built_ahead = set((tmp_path / "cpp").rglob("*.so"))
        launch = factory.build(problem, cand, get_target("cpu"))
        assert renders == ["cpp.pointwise"]  # build() took the rendering prepare() made
        lib = cpp.library_path(launch.__globals__["SOURCE"], "cpp_pointwise")
        assert lib in built_ahead and cpp.is_valid(lib)
        x = torch.randn(6, 41)
        (out,) = launch(x, outs=None)
        torch.testing.assert_close(out, torch.tanh(x) * 3 + x)


def test_render_imports_are_found_in_every_kind_of_statement_block(tmp_path):
    """Only statement bodies are walked for imports: every block that holds statements counts."""
    from tilewright.templates.base import _module_file, _render_imports_cached

    names = ["tilewright.ir.dtypes", "tilewright.ir.index", "tilewright.ir.expr", "tilewright.ir.ops",
             "tilewright.ir.kernel", "tilewright.templates.loop_schedule", "tilewright.templates.c_expr"]
    mod = tmp_path / "blocks.py"
    mod.write_text(f"""
import os
try:
    import {names[0]}
except ImportError:
    from {names[1]} import offset
else:
    pass
finally:
    x = 1
class K:
    def f(self):
        with open(os.devnull):
            for _ in ():
                while False:
                    if True:
                        pass
                    else:
                        import {names[2]}
        match self:
            case 1:
                from {names[3]} import OPS
    async def g(self):
        async with self:
            import {names[4]}
def h():
    if x:
        from tilewright.templates import loop_schedule
    lambda: __import__("tilewright.nothing")
from tilewright import problem  # not a package that shapes rendered text
""")
    found = set(_render_imports_cached(mod, mod.stat().st_mtime_ns, mod.stat().st_size))
    want = {_module_file(n) for n in names} - {None, _module_file("tilewright.templates.c_expr")}
    assert want <= found, sorted(map(str, want - found))
