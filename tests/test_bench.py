"""The benchmarker: input sets are rotated, repetitions adapt to a stable estimate, and the
budget and abort rules stop timing early. Time is simulated (a fake clock), never asserted on."""

from __future__ import annotations

import itertools

import pytest
import torch

from tilewright.autotune import bench
from tilewright.autotune.bench import summarise, time_callable

CPU = torch.device("cpu")


@pytest.fixture
def clock(monkeypatch):
    """A fake perf_counter: each timed call advances it by the next duration (ms) scripted."""
    state = {"now": 0.0, "durations": iter(())}

    def script(durations_ms):
        state["durations"] = iter(durations_ms)

    def fake_counter():
        return state["now"]

    def work():
        state["now"] += next(state["durations"]) / 1e3

    monkeypatch.setattr(bench.time, "perf_counter", fake_counter)
    return script, work


def test_input_sets_are_rotated():
    seen = []
    fns = [lambda i=i: seen.append(i) for i in range(3)]
    t = time_callable(fns, CPU, warmup=1, rep=7, budget_ms=1e9)
    assert seen[:3] == [0, 1, 2], "warm-up touches every input set once"
    assert seen[3:] == [0, 1, 2, 0, 1, 2, 0] and t.reps == 7


def test_stable_timings_stop_after_min_rep(clock):
    script, work = clock
    script(itertools.repeat(2.0))
    t = time_callable(work, CPU, warmup=0, rep=100, budget_ms=1e9, min_rep=5, stable_pct=1.0)
    assert t.reps == 5 and t.median_ms == pytest.approx(2.0) and t.spread_ms == pytest.approx(0.0)


def test_noisy_timings_run_until_stable_or_rep(clock):
    script, work = clock
    script(itertools.cycle([1.0, 3.0]))
    t = time_callable(work, CPU, warmup=0, rep=40, budget_ms=1e9, min_rep=5, stable_pct=1.0)
    assert t.reps == 40 and t.spread_ms > 0.5


def test_budget_and_abort(clock):
    script, work = clock
    script(itertools.repeat(10.0))
    assert time_callable(work, CPU, warmup=0, rep=100, budget_ms=35.0).reps == 4
    script(itertools.repeat(10.0))
    t = time_callable(work, CPU, warmup=0, rep=100, budget_ms=1e9, abort_above_ms=5.0)
    assert t.aborted and t.reps == 1


def test_summarise():
    t = summarise([1.0, 2.0, 3.0, 4.0, 100.0])
    assert t.median_ms == 3.0 and t.spread_ms < 30, "the spread ignores one outlier"
    assert summarise([2.0]).spread_ms == 0.0
    with pytest.raises(ValueError, match="at least one"):
        summarise([])
