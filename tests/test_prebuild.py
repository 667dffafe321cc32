"""A graph's C++ builds start before its first kernel is tuned (compiler/prebuild.py), none of
them runs while anything is timed, and a build that fails costs its candidate only."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import tilewright
from tilewright.runtime import cpp

MISSING = cpp.unavailable_reason()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"no C++ compiler: {MISSING}")
# C++ candidates only, each checked against float64 and timed briefly
SHORT = dict(force_backend="cpp", strict=True, bench_rep=1, bench_min_rep=1, bench_warmup=0, bench_budget_ms=0.0)


def _model(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # two loop kernels the GEMM keeps apart: a pointwise before it, a softmax after it
    y = torch.tanh(a) * 3 + a
    return torch.softmax(y @ w, dim=-1) * 2


def _library(problem, cand) -> object:
    """The C++ library a candidate's module loads."""
    from tilewright.compiler.kernel_factory import default_factory
    from tilewright.runtime.targets import get_target
    from tilewright.templates.cpp import _MODULE_KERNEL

    m = _MODULE_KERNEL.search(default_factory.render(problem, cand, get_target("cpu")).source)
    return cpp.library_path(m.group(1), m.group(2))


def test_a_graphs_cpp_builds_start_before_its_first_problem_is_tuned_and_a_failed_build_costs_its_candidate(
        fresh_cache, monkeypatch):
    from tilewright.autotune import select as sel_mod
    from tilewright.compiler import dispatch, prebuild
    from tilewright.compiler.report import collect_reports
    from tilewright.errors import KernelCompileError

    planned: list[tuple[object, list]] = []
    doomed: dict[str, object] = {}

    def to_build(problem, target, cache=None):
        cands = sel_mod.to_build(problem, target, cache)
        planned.append((problem, cands))
        libs = [_library(problem, c) for c in cands]  # candidates may share one source
        if len(set(libs)) >= 2 and not doomed:  # the last-ranked library of the first problem with a choice
            doomed["lib"], doomed["keys"] = libs[-1], {c.key for c, lib in zip(cands, libs) if lib == libs[-1]}
        return cands

    compiles: list[tuple[float, float, str, object]] = []  # start, end, thread, library
    real_compile = cpp._compile

    def compile_(source, lib):
        t0 = time.perf_counter()
        try:
            if lib == doomed.get("lib"):
                raise KernelCompileError(f"C++ kernel {lib} did not build (made to fail by the test)")
            real_compile(source, lib)
        finally:
            compiles.append((t0, time.perf_counter(), threading.current_thread().name, lib))

    first_eval: list[float] = []
    real_evaluate = sel_mod.evaluate

    def evaluate(task, factory, *a, **kw):
        first_eval.append(time.perf_counter())
        return real_evaluate(task, factory, *a, **kw)

    selections = []
    real_select = dispatch.select

    def select(problem, target, factory, **kw):
        s = real_select(problem, target, factory, **kw)
        selections.append(s)
        return s

    monkeypatch.setattr(prebuild, "to_build", to_build)
    monkeypatch.setattr(cpp, "_compile", compile_)
    monkeypatch.setattr(sel_mod, "evaluate", evaluate)
    monkeypatch.setattr(dispatch, "select", select)

    g = torch.Generator().manual_seed(3)
    a, w = torch.randn(3, 61, generator=g), torch.randn(61, 8243, generator=g)  # softmax rows long enough to loop over
    torch._dynamo.reset()
    try:
        with tilewright.config.patch(**SHORT), collect_reports() as graphs:
            out = torch.compile(_model, backend="tilewright")(a, w)
    finally:
        torch._dynamo.reset()

    ref = _model(a.double(), w.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5
    assert graphs and not any(g.fallback for g in graphs)

    with_builds = [(p, c) for p, c in planned if c]
    assert len(with_builds) >= 2 and doomed, planned  # two problems to tune, one candidate to break
    wanted = {_library(p, c) for p, cands in with_builds for c in cands}
    background = [c for c in compiles if c[2].startswith("tilewright-prebuild")]
    # every candidate of every problem was built in the background pool ...
    assert {lib for *_, lib in background} == wanted
    # ... started and finished before the first candidate was evaluated: nothing timed beside g++
    assert first_eval and max(end for _, end, _, _ in background) <= min(first_eval)
    # the only build in the tuner's own thread is the failed one, met again when it is loaded
    assert {lib for *_, t, lib in compiles if not t.startswith("tilewright-prebuild")} <= {doomed["lib"]}

    results = {r.candidate.key: r.record for s in selections for r in s.results}
    for key in doomed["keys"]:
        assert results[key].status == "failed" and "made to fail by the test" in (results[key].reason or "")
    others = [rec for key, rec in results.items() if key not in doomed["keys"]]
    assert others and all(rec.status in ("ok", "aborted") for rec in others)
    # the loop kernels (the GEMM times ATen alone) are won by a C++ candidate that built
    winners = [(s.winner.key, s.winner.backend) for s in selections
               if any(r.candidate.backend == "cpp" for r in s.results)]
    assert winners and all(k not in doomed["keys"] and b == "cpp" for k, b in winners), winners


def test_problems_in_the_tuning_cache_start_no_builds(fresh_cache, monkeypatch):
    """A second compile of the same graph (its problems' records in the tuning cache) hands no
    candidate to the background builds: the records already judged them."""
    from tilewright.compiler import prebuild

    g = torch.Generator().manual_seed(4)
    a, w = torch.randn(5, 33, generator=g), torch.randn(33, 17, generator=g)
    torch._dynamo.reset()
    with tilewright.config.patch(**SHORT):
        torch.compile(_model, backend="tilewright")(a, w)
    torch._dynamo.reset()
    handed = []
    real = prebuild.start_builds
    monkeypatch.setattr("tilewright.compiler.pipeline.start_builds", lambda calls: handed.append(real(calls)) or handed[-1])
    try:
        with tilewright.config.patch(**SHORT):
            out = torch.compile(_model, backend="tilewright")(a, w)
    finally:
        torch._dynamo.reset()
    ref = _model(a.double(), w.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5
    assert handed and all(n == 0 for n in handed)


_FORKED = """
import os, sys, torch, tilewright
torch.set_num_threads(1)
x = torch.randn(64, 300)
ref = torch.softmax(x.double() * 2, -1)
out = torch.compile(lambda x: torch.softmax(x * 2, -1), backend="tilewright")(x)  # the pool exists
pid = os.fork()
if pid == 0:
    torch._dynamo.reset()
    y = torch.randn(32, 500)
    out = torch.compile(lambda y: torch.log_softmax(y.sin() * 3, -1), backend="tilewright")(y)
    ref = torch.log_softmax(y.double().sin() * 3, -1)
    os._exit(0 if ((out.double() - ref).norm() / ref.norm()).item() < 1e-5 else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_builds_in_its_own_pool(tmp_path):
    # a child forked after the parent built (gate_noise.py --fork, a data loader) inherited a pool
    # whose threads it does not have: its builds queued for ever and its first compile hung
    import os
    import subprocess
    import sys

    env = dict(os.environ, TILEWRIGHT_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", _FORKED], env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
