"""The graph race: a compiled CPU graph against the same graph on ATen, measured on real calls.

The tuner chooses each kernel by timing it alone, which leaves out what only the whole graph
shows: the wrapper's Python between kernels, caches warmed or evicted by the neighbours, a fused
kernel whose unfused ATen ops were cheaper in place. On the CPU, where nothing is asynchronous
and the wall time of a call is the graph's time, that is measured directly instead: the graph's
first calls alternate between the compiled graph and the FX graph it was compiled from (run op
by op on ATen, what the run-time fallback runs too), and after ``config.graph_race_rounds``
timed calls of each (one untimed call of each first: lazy loads, first-touch allocations) the
side with the lower median runs from then on. Every call runs exactly one side and returns its
result, so the race costs no extra work and changes no random stream; both sides are the same
graph, so a call's answer is the graph's answer whichever runs it. The first two calls both
run the compiled graph.

A call made while :func:`tilewright.compiler.dispatches.counting` counts ATen calls runs the
compiled graph and is no round of the race (the count is of the compiled graph's calls). Only
calls with the input shapes of the first timed call count (a dynamic graph's sizes differ
between calls); a graph whose sizes never repeat keeps running compiled. The outcome goes into
the graph's report (``GraphReport.race``: each side's median ms and the winner), which
``tilewright explain`` and the demo print.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from typing import Any, Callable

import torch
from torch._functorch.aot_autograd import make_boxed_func

from tilewright._config import config
from tilewright.compiler.dispatches import active as counting_dispatches

log = logging.getLogger("tilewright.compiler")

# calls after which a race still missing timings (sizes that keep changing) stops: compiled wins
_GIVE_UP_CALLS = 64
# the compiled graph keeps ties: ATen wins only when its median is lower by more than this share
_MARGIN = 0.02


def _all_on_cpu(example_inputs: list[Any]) -> bool:
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    return all(t.device.type == "cpu" for t in tensors)


def _shape_key(args: list) -> tuple:
    return tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args)


def raced(compiled: Callable[[list], Any], gm: torch.fx.GraphModule, example_inputs: list[Any],
          report: Any) -> Callable[[list], Any]:
    """``compiled`` (a boxed compiled graph) raced against ``gm`` run on ATen, or ``compiled``
    itself where no race runs (``config.graph_race`` "off", inputs not all on the CPU, no
    rounds). ``report`` (a :class:`~tilewright.compiler.report.GraphReport`) gets the outcome
    in ``report.race`` once decided: ``{"compiled_ms", "aten_ms", "rounds", "winner"}``."""
    rounds = int(config.graph_race_rounds)
    if config.graph_race == "off" or rounds < 1 or not _all_on_cpu(example_inputs):
        return compiled
    aten = make_boxed_func(gm.forward)
    sides = {"compiled": compiled, "aten": aten}
    times: dict[str, list[float]] = {"compiled": [], "aten": []}
    lock = threading.Lock()
    state: dict[str, Any] = {"calls": 0, "key": None, "winner": None}

    def decide() -> None:
        med = {name: statistics.median(ts) for name, ts in times.items()}
        winner = "aten" if med["aten"] < med["compiled"] * (1 - _MARGIN) else "compiled"
        state["winner"] = winner
        report.race = {"compiled_ms": round(med["compiled"], 4), "aten_ms": round(med["aten"], 4),
                       "rounds": rounds, "winner": winner}
        if winner == "aten":
            log.info("graph %s: ATen's %.3f ms beat the compiled graph's %.3f ms (median of %d calls "
                     "each); it runs on ATen from now on", report.graph_id, med["aten"], med["compiled"],
                     rounds)

    def call(args: list) -> Any:
        winner = state["winner"]
        if winner is not None:
            return sides[winner](args)
        if counting_dispatches():
            return compiled(args)  # a count of the compiled graph's calls, not a round of the race
        with lock:
            n = state["calls"]
            state["calls"] = n + 1
        # compiled untimed, compiled, ATen untimed, then ATen and compiled in turn: a model
        # called once or twice runs only its compiled graph
        if n == 0 or n == 2:
            return sides["compiled" if n == 0 else "aten"](args)
        if n >= _GIVE_UP_CALLS:
            state["winner"] = "compiled"
            report.race = {"winner": "compiled", "rounds": 0,
                           "why": "the graph's input sizes kept changing: nothing to compare"}
            return compiled(args)
        key = _shape_key(args)
        if state["key"] is None:
            state["key"] = key
        side = "compiled" if n == 1 or n % 2 == 0 else "aten"
        if key != state["key"] or len(times[side]) >= rounds:
            return compiled(args)
        t0 = time.perf_counter()
        out = sides[side](args)
        elapsed = (time.perf_counter() - t0) * 1e3
        with lock:
            times[side].append(elapsed)
            if state["winner"] is None and all(len(ts) >= rounds for ts in times.values()):
                decide()
        return out

    call._boxed_call = True  # type: ignore[attr-defined]
    return call
