"""The graph race: a compiled CPU graph against ATen, measured on the graph's first real calls.

The tuner chooses each kernel by timing it alone, which leaves out what only the whole graph
shows: the wrapper's Python between kernels, caches warmed or evicted by the neighbours, a fused
kernel whose unfused ATen ops were cheaper in place. On the CPU, where nothing is asynchronous
and the wall time of a call is the graph's time, that is measured directly instead. The ATen
side is, for an inference graph, Dynamo's graph as eager runs it (the model's own ops: no
decompositions, no aot_autograd wrappers; :func:`raced_with_eager`) and, for a training graph's
forward and backward, the graph aot_autograd handed the pipeline run op by op (what the
run-time fallback runs; :func:`raced`). The first two calls run compiled, then one untimed ATen
call (lazy loads, first-touch allocations), then the sides alternate for
``config.graph_race_rounds`` timed calls each (a call with an empty input runs compiled and is
no round; with one torch thread a call is timed in CPU time of its thread, which the host's
other jobs barely disturb). Each compiled call is paired with the ATen call next to it, and the
compiled graph runs from then on only when the median of those pairs' ratios says it is faster
by more than a margin (:func:`decide`): ties go to ATen, the model's own ops, the safe side. A
close race (the median within ``_CLOSE`` of a tie) runs more rounds, up to ``_MAX_ROUNDS`` times
as many, before it is decided: a close race's extra calls cost little, since the two sides take
about the same time. (The fastest call of each side, the rule before, favoured the side whose
times spread more: a softmax kernel whose fastest call was 2% above eager's while its median was
25% above kept the compiled graph.) Every call runs exactly one side and returns its result, so
the race costs no extra work and changes no random stream; both sides compute the same graph,
so a call's answer is the graph's answer whichever runs it.

A call made while :func:`tilewright.compiler.dispatches.counting` counts ATen calls runs the
compiled graph and is no round of the race (the count is of the compiled graph's calls). Only
calls with the input shapes of the first timed call count (a dynamic graph's sizes differ
between calls); a graph whose sizes never repeat keeps running compiled. The outcome goes into
the graph's report (``GraphReport.race``: each side's median call in ms, the median paired
ratio, the rounds run, which ATen side, the winner), which the ``cpu`` bench rows list.
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
# ties go to ATen: the compiled graph wins only when its median paired ratio is below 1 - _MARGIN
_MARGIN = 0.03
# a median paired ratio within _CLOSE of 1 is a close race: more rounds, up to _MAX_ROUNDS times
# the configured rounds, before it is decided
_CLOSE = 0.10
_MAX_ROUNDS = 3


def decide(compiled_ms: list[float], aten_ms: list[float], final: bool) -> tuple[str | None, float]:
    """(the winner, or None where the race needs more rounds; the median paired ratio).

    ``compiled_ms[i]`` and ``aten_ms[i]`` are timed calls next to each other (ms); each pair's
    ratio compiled/ATen cancels the host's drift between pairs, and their median ignores a few
    disturbed calls. The compiled graph wins at a median below ``1 - _MARGIN``; a median within
    ``_CLOSE`` of 1 asks for more rounds unless ``final``; anything else, ties included, goes to
    ATen (the model's own ops: a compiled graph no faster than them only adds risk)."""
    pairs = min(len(compiled_ms), len(aten_ms))
    if pairs == 0:
        raise ValueError("the graph race decides on at least one timed call of each side")
    ratio = statistics.median(c / max(a, 1e-9) for c, a in zip(compiled_ms[:pairs], aten_ms[:pairs]))
    if not final and abs(ratio - 1) <= _CLOSE:
        return None, ratio
    return ("compiled" if ratio < 1 - _MARGIN else "aten"), ratio


def eager_forward(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """``gm``'s generated ``forward``, the graph's ops called one by one, with no layer between.

    Dynamo hands over a lazily recompiled graph module (``_LazyGraphModule``): until its code is
    generated, ``gm.forward`` is a stub that checks for a pending recompile and then calls the
    module through ``nn.Module.__call__`` (hooks, tracing-state checks): ~10 Python calls more a
    call, 2-5% of a 0.1 ms graph (measured, a 256x512 softmax). Generating the code first makes
    ``gm.forward`` the graph's own function, as Dynamo's ``eager`` backend calls it."""
    recompile = getattr(gm, "real_recompile", None)
    if recompile is not None:
        recompile()
    return gm.forward


def aten_graph(gm: torch.fx.GraphModule) -> Callable[[list], Any]:
    """aot_autograd's graph ``gm`` run op by op on ATen (boxed), what a graph falls back to. An
    error it raises is the input's (nothing of tilewright runs), in the words of the decomposed
    ops: it is marked for :func:`~tilewright.compiler.backend.with_eager_errors`, which asks the
    model's own ops for eager's."""
    run = make_boxed_func(eager_forward(gm))

    def call(args: list) -> Any:
        try:
            return run(args)
        except Exception as e:
            e.tilewright_refused_input = True  # type: ignore[attr-defined]
            raise

    call._boxed_call = True  # type: ignore[attr-defined]
    return call


def _all_on_cpu(example_inputs: list[Any]) -> bool:
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    return all(t.device.type == "cpu" for t in tensors)


def _shape_key(args: list) -> tuple:
    return tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args)


class _Race:
    """The race's state for one graph: which call this is, the timings, the winner."""

    def __init__(self, compiled: Callable, aten: Callable, reports: list[Any], rounds: int, eager: bool):
        self.sides = {"compiled": compiled, "aten": aten}
        self.reports = reports
        self.rounds = rounds  # the configured rounds per side
        self.limit = rounds  # the rounds this race runs: more where it is close (decide)
        self.eager = eager  # the ATen side is the model's own ops (Dynamo's graph), not aot's
        self.times: dict[str, list[float]] = {"compiled": [], "aten": []}
        self.lock = threading.Lock()
        self.calls = 0
        self.key: tuple | None = None
        self.winner: str | None = None
        self.fast: Callable | None = None  # the winner's callable, once decided: called directly

    def _publish(self, outcome: dict[str, Any]) -> None:
        for r in self.reports:
            r.race = outcome

    def _decide(self) -> None:
        final = self.limit >= _MAX_ROUNDS * self.rounds
        winner, ratio = decide(self.times["compiled"], self.times["aten"], final)
        if winner is None:  # close: another batch of rounds
            self.limit = min(self.limit + self.rounds, _MAX_ROUNDS * self.rounds)
            return
        med = {name: statistics.median(ts) for name, ts in self.times.items()}
        self.winner = winner
        self.fast = self.sides[self.winner]
        self._publish({"compiled_ms": round(med["compiled"], 4), "aten_ms": round(med["aten"], 4),
                       "ratio": round(ratio, 4), "rounds": self.limit, "winner": self.winner,
                       "aten_side": "eager ops" if self.eager else "the decomposed graph"})
        if self.winner == "aten":
            log.info("graph %s: the compiled graph took %.3fx ATen's time (median of %d paired calls; "
                     "%.3f ms vs %.3f ms); it runs on ATen from now on", [r.graph_id for r in self.reports],
                     ratio, self.limit, med["compiled"], med["aten"])

    def _aten_cannot_run(self, e: Exception) -> None:
        with self.lock:
            self.winner = "compiled"
            self.fast = self.sides["compiled"]
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        self._publish({"winner": "compiled", "rounds": 0,
                       "why": f"the graph's own ops do not run here ({type(e).__name__}: {first})"})

    def side(self, args: Any) -> tuple[str, bool]:
        """(the side this call runs, whether it is timed)."""
        if self.winner is not None:
            return self.winner, False
        if counting_dispatches():
            return "compiled", False  # a count of the compiled graph's calls, not a round
        if any(isinstance(a, torch.Tensor) and a.numel() == 0 for a in args):
            # an empty batch: nothing worth timing, and the decomposed graph's ops warn on it
            # (var_mean's "degrees of freedom is <= 0", every call) where the compiled graph does not
            return "compiled", False
        with self.lock:
            n = self.calls
            self.calls = n + 1
        # compiled untimed, compiled, ATen untimed, then ATen and compiled in turn: a model
        # called once or twice runs only its compiled graph
        if n == 0 or n == 2:
            return ("compiled" if n == 0 else "aten"), False
        if n >= max(_GIVE_UP_CALLS, 4 + 2 * self.limit):
            self.winner = "compiled"
            self.fast = self.sides["compiled"]
            self._publish({"winner": "compiled", "rounds": 0,
                           "why": "the graph's input sizes kept changing: nothing to compare"})
            return "compiled", False
        key = _shape_key(args)
        if self.key is None:
            self.key = key
        name = "compiled" if n == 1 or n % 2 == 0 else "aten"
        if key != self.key or len(self.times[name]) >= self.limit:
            return "compiled", False
        return name, True

    def record(self, name: str, ms: float) -> None:
        with self.lock:
            self.times[name].append(ms)
            if self.winner is None and all(len(ts) >= self.limit for ts in self.times.values()):
                self._decide()

    def reraise(self, e: Exception, name: str | None = None) -> None:
        """Raise ``e``, which the side ``name`` (default: the winner) raised."""
        if (name or self.winner) == "compiled":
            raise e  # the run-time fallback's wrapper has said what it must
        # the graph's own ops refused the input (a dtype mismatch): the user's error, in one
        # line as eager raises it and as the compiled side reports it
        raise e.with_traceback(None) from None

    def run(self, args: Any, call: Callable[[Callable], Any]) -> Any:
        name, timed = self.side(args)
        clock = _clock()
        t0 = clock()
        try:
            out = call(self.sides[name])
        except Exception as e:
            if name != "aten":
                self.reraise(e, name)
            # the graph's own ops may not run on this host at all (a block-scaled F.scaled_mm on a
            # CPU: "CPU does not support swizzle") where the compiled graph does: it wins
            try:
                out = call(self.sides["compiled"])
            except Exception:
                self.reraise(e, name)  # both refuse the input: the user's error, as eager says it
            self._aten_cannot_run(e)
            return out
        if timed:
            self.record(name, (clock() - t0) * 1e3)
        return out


def _clock() -> Callable[[], float]:
    """The race's clock: with one torch thread every op of either side runs on the calling
    thread (the C++ loop kernels take torch's thread count too), so its CPU time is the call's
    cost, which other jobs on a busy host barely disturb (wall time there mostly measures the
    wait for a core: perf/cpu_suite.py thread_ms); with more threads, wall time."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def race_rounds(example_inputs: list[Any]) -> int:
    """Timed calls per side, 0 where no race runs (``config.graph_race`` "off", inputs not all
    on the CPU)."""
    if config.graph_race == "off" or not _all_on_cpu(example_inputs):
        return 0
    return max(0, int(config.graph_race_rounds))


def calls_to_decide() -> int:
    """Calls of a graph after which its race is decided, close or not (the two untimed calls,
    the untimed ATen call, then every round a close race may run, both sides): what a bench
    calls a model before timing its steady state."""
    return 3 + 2 * _MAX_ROUNDS * max(0, int(config.graph_race_rounds))


def raced(compiled: Callable[[list], Any], gm: torch.fx.GraphModule, example_inputs: list[Any],
          report: Any) -> Callable[[list], Any]:
    """``compiled`` (a boxed compiled graph) raced against ``gm`` (aot_autograd's graph) run on
    ATen, or ``compiled`` itself where no race runs (``config.graph_race`` "off", inputs not all
    on the CPU, no rounds). ``report`` (a :class:`~tilewright.compiler.report.GraphReport`)
    gets the outcome in ``report.race`` once decided: ``{"compiled_ms", "aten_ms", "rounds",
    "winner", "aten_side"}``."""
    rounds = race_rounds(example_inputs)
    if rounds < 1:
        return compiled
    race = _Race(compiled, aten_graph(gm), [report], rounds, eager=False)

    def call(args: list) -> Any:
        fast = race.fast  # decided: the winner with no layer between (a try costs nothing)
        if fast is not None:
            try:
                return fast(args)
            except Exception as e:
                race.reraise(e)
        return race.run(args, lambda side: side(args))

    call._boxed_call = True  # type: ignore[attr-defined]
    return call


def raced_with_eager(compiled: Callable[..., Any], gm: torch.fx.GraphModule, example_inputs: list[Any],
                     reports: list[Any]) -> Callable[..., Any]:
    """For an inference graph: ``compiled`` (what aot_autograd made of Dynamo's graph ``gm``)
    raced against ``gm`` itself, the model's own ops as eager runs them (no decompositions, no
    aot_autograd wrappers): the one comparison that makes a compiled model no slower than eager
    on a CPU. Called as Dynamo calls a backend's result (``*args``). ``reports`` (the graph
    reports compiling ``gm`` made) get the outcome. ``compiled`` itself where no race runs."""
    rounds = race_rounds(example_inputs)
    if rounds < 1:
        return compiled
    race = _Race(compiled, eager_forward(gm), reports, rounds, eager=True)

    def call(*args: Any) -> Any:
        fast = race.fast
        if fast is not None:
            try:
                return fast(*args)
            except Exception as e:
                race.reraise(e)
        return race.run(args, lambda side: side(*args))

    return call
