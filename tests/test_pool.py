"""Isolated tuning on a simulated device: candidates that crash, hang, run out of memory or give
wrong results in worker processes are disqualified with their reasons, the best valid one wins,
selection under noise is stable, and no worker is left running afterwards."""

from __future__ import annotations

import psutil
import pytest
from fakes import Behaviour, FakeFactory, FakePolicy

import tilewright
from tilewright.autotune import select as select_mod
from tilewright.autotune.cache import TuningCache
from tilewright.autotune.pool import CompileTimeouts, WorkerPool, pool_scope
from tilewright.autotune.select import select_gemm
from tilewright.problem import GemmProblem
from tilewright.runtime.targets import get_target

PROBLEM = GemmProblem(M=24, N=40, K=16, dtype="fp32")


def worker_children() -> list[psutil.Process]:
    """Our live child processes, less multiprocessing's resource tracker (a helper that lives
    as long as the test process, not a tuning worker)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """run(behaviours, names=None, **factory_kw) -> (selection, factory), with isolation on."""

    def run(behaviours, names=None, cache=None, pool=None, **kw):
        names = names or list(behaviours)
        factory = FakeFactory(behaviours, **kw)
        monkeypatch.setattr(select_mod, "policy_for", lambda op, t: FakePolicy(names))
        cache = cache or TuningCache(tmp_path / f"t-{len(list(tmp_path.iterdir()))}.json")
        sel = select_gemm(PROBLEM, get_target("cpu"), factory, cache=cache, pool=pool)
        return sel, factory

    with tilewright.config.patch(isolate="on", compile_timeout_s=20.0, bench_timeout_s=20.0):
        yield run


@pytest.mark.slow
def test_faults_in_workers_disqualify_only_their_candidate(isolated):
    behaviours = {
        "aten": Behaviour("good", 5.0),
        "segfault": Behaviour("segfault", 0.1),
        "abort": Behaviour("abort", 0.1),
        "hang_build": Behaviour("hang_build", 0.1),
        "oom": Behaviour("oom", 0.1),
        "memory_error": Behaviour("memory_error", 0.1),
        "illegal": Behaviour("run_error", 0.1),
        "wrong": Behaviour("wrong", 0.2),
        "fast": Behaviour("good", 1.0),
        "hang_run": Behaviour("hang_run", 0.1),
        "slow": Behaviour("good", 3.0),
    }
    with tilewright.config.patch(compile_timeout_s=4.0, bench_timeout_s=4.0):
        sel, factory = isolated(behaviours)
    assert sel.winner.param_dict.get("name") == "fast"
    rec = {r.candidate.param_dict.get("name", "aten"): r.record for r in sel.results}
    assert factory.builds == ["aten"], "only ATen may run in the tuning process"
    assert rec["segfault"].status == "failed" and "SIGSEGV" in rec["segfault"].reason
    assert rec["abort"].status == "failed" and "SIGABRT" in rec["abort"].reason
    assert rec["hang_build"].status == "failed" and "timeout: compile" in rec["hang_build"].reason
    assert rec["hang_run"].status == "failed" and "timeout" in rec["hang_run"].reason
    assert rec["oom"].status == "failed" and "OutOfMemoryError" in rec["oom"].reason
    assert rec["memory_error"].status == "failed" and "MemoryError" in rec["memory_error"].reason
    assert rec["illegal"].status == "failed" and "illegal memory access" in rec["illegal"].reason
    assert rec["wrong"].status == "wrong" and "tolerance" in rec["wrong"].reason
    assert rec["fast"].status == rec["slow"].status == "ok"
    assert not worker_children(), "a tuning worker outlived the selection"


@pytest.mark.slow
def test_workers_are_replaced_and_none_remain(isolated):
    behaviours = {"aten": Behaviour("good", 5.0), "a": Behaviour("exit"), "b": Behaviour("good", 2.0),
                  "c": Behaviour("oom"), "d": Behaviour("good", 1.0)}
    with WorkerPool(["cpu"]) as pool:
        sel, _ = isolated(behaviours, pool=pool)
        # a crash and a fatal error each cost a worker: three workers served five candidates
        assert len(pool.pids) == 3
    assert sel.winner.param_dict["name"] == "d"
    assert "exited with code 3" in next(r.record.reason for r in sel.results
                                        if r.candidate.param_dict.get("name") == "a")
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pool.pids)
    assert not worker_children()


@pytest.mark.slow
def test_twenty_isolated_selections_under_noise_agree(isolated):
    # a and b are within noise of each other: every process must choose a (the lower rank)
    behaviours = {"aten": Behaviour("good", 9.0), "a": Behaviour("good", 1.00),
                  "b": Behaviour("good", 0.99), "c": Behaviour("good", 1.4)}
    winners = set()
    with pool_scope():
        for seed in range(20):
            sel, _ = isolated(behaviours, noise=0.05, seed=seed)
            winners.add(sel.winner.param_dict["name"])
    assert winners == {"a"}
    assert not worker_children()


def test_compile_timeout_adapts_to_observed_compiles():
    t = CompileTimeouts(floor_s=10.0, factor=5.0)
    assert t.seconds == 10.0, "no compile seen yet: the floor"
    for s in (1.0, 1.2, 0.8):
        t.observe(s)
    assert t.seconds == 10.0, "fast compiles never take the timeout below the floor"
    for s in (6.0, 7.0, 8.0, 9.0):
        t.observe(s)
    assert t.seconds == pytest.approx(5.0 * 6.0)
    assert "median compile 6.00 s" in t.describe()


def test_compile_timeout_follows_config():
    t = CompileTimeouts()
    with tilewright.config.patch(compile_timeout_s=3.0, compile_timeout_factor=2.0):
        t.observe(4.0)
        assert t.seconds == 8.0


def test_isolation_is_off_on_the_cpu_by_default(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr("tilewright.autotune.pool.WorkerPool.__init__",
                        lambda self, *a, **k: started.append(a))
    monkeypatch.setattr(select_mod, "policy_for", lambda op, t: FakePolicy(["aten", "x"]))
    factory = FakeFactory({"aten": Behaviour("good", 2.0), "x": Behaviour("good", 1.0)})
    assert tilewright.config.isolate == "auto"
    sel = select_gemm(PROBLEM, get_target("cpu"), factory, cache=TuningCache(tmp_path / "t.json"))
    assert sel.winner.param_dict["name"] == "x" and not started and factory.builds == ["aten", "x"]
