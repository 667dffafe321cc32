"""Evaluating one candidate for one problem: build, check against the reference, time.

The same function runs in the tuning process (ATen, and everything when isolation is off) and in
the worker processes of :mod:`tilewright.autotune.pool`. A candidate that fails to build or run,
or whose error exceeds the dtype's tolerance, gets a record saying why and can never win.

Inputs are random normal tensors with the problem's layouts, made from ``seed`` (so every process
makes the same ones), in ``config.bench_input_sets`` sets that timing cycles through. Each
candidate writes its own output buffers, freshly filled with NaN, so an element it fails to write
shows up in the check, which compares with the float64 reference before any time counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from tilewright._config import config
from tilewright.autotune.bench import time_callable
from tilewright.autotune.cache import Record
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.kinds import kind_of
from tilewright.runtime.targets import get_target

# errors after which a process's device state cannot be trusted (a worker is replaced)
_FATAL_TYPES = ("OutOfMemoryError", "MemoryError", "AcceleratorError")
_FATAL_TEXT = ("CUDA error", "HIP error", "illegal memory access", "out of memory",
               "device-side assert")


@dataclass(frozen=True)
class EvalTask:
    """One candidate to evaluate for one problem on one local device.

    ``best_ms``: the best median seen so far for this problem (a CPU candidate whose first run
    is ``config.bench_abort_ratio`` times slower is not timed further); ``device``: a torch
    device string ("cpu", "cuda:1").
    """

    problem: Any  # GemmProblem | LoopProblem
    candidate: Candidate
    target: str
    device: str
    seed: int = 0
    best_ms: float | None = None


@dataclass
class EvalOutcome:
    """A record, the seconds building plus the first (compiling) run took when it got that far,
    and whether the process's device state is now suspect (CUDA error, OOM)."""

    record: Record
    compile_s: float | None = None
    fatal: bool = False


def is_fatal(e: BaseException) -> bool:
    """True for errors that may leave the device unusable in this process (CUDA errors, OOM)."""
    text = str(e)
    return type(e).__name__ in _FATAL_TYPES or any(t in text for t in _FATAL_TEXT)


def input_set_count(problem: Any, target_name: str) -> int:
    """How many input sets to rotate through: ``config.bench_input_sets``, or 1 when the
    operands are over twice the target's L2 (no cache could flatter the kernel then) or the
    target is interpreted (the interpreter's overhead dwarfs any cache effect, and each extra
    set costs a warm-up run)."""
    target = get_target(target_name)
    if target.interpreted or problem.min_bytes > 2 * target.l2_bytes:
        return 1
    return max(1, config.bench_input_sets)


# the inputs and reference of the last problem evaluated in this process (candidates of one
# problem come in a row, so one entry is enough and device memory is not held longer)
_last: dict[str, Any] = {}


def _inputs_and_reference(task: EvalTask, factory: Any) -> tuple[list[Any], Callable]:
    key = (task.problem, task.device, task.seed, input_set_count(task.problem, task.target))
    if _last.get("key") != key:
        _last.clear()
        device = torch.device(task.device)
        make = kind_of(task.problem).make_inputs
        _last["inputs"] = [make(task.problem, device, task.seed + i) for i in range(key[3])]
        _last["key"] = key

    def ref() -> torch.Tensor:
        if "ref" not in _last:
            _last["ref"] = factory.reference(task.problem, _last["inputs"][0])
        return _last["ref"]

    return _last["inputs"], ref


def forget_inputs() -> None:
    """Drop the cached inputs and reference (frees device memory)."""
    _last.clear()


def evaluate(task: EvalTask, factory: Any,
             on_compiled: Callable[[float], None] | None = None) -> EvalOutcome:
    """Build, check and time ``task.candidate``; never raises for the candidate's faults.

    Args:
        task: what to evaluate, where.
        factory: a :class:`~tilewright.autotune.select.KernelFactory`; a simulated device's
            factory may carry its own clock as ``factory.timer`` (same signature as
            :func:`~tilewright.autotune.bench.time_callable`).
        on_compiled: called with the seconds build + first run took, before timing starts
            (the worker pool switches from its compile timeout to its run timeout there).
    """
    cand, problem = task.candidate, task.problem
    base = dict(template_id=cand.template_id, template_hash=cand.template_hash,
                params=cand.param_dict, rank=cand.rank, predicted_ms=cand.predicted_ms)
    timer = getattr(factory, "timer", None) or time_callable
    device = torch.device(task.device)
    t0 = time.perf_counter()
    try:
        launch = factory.build(problem, cand, get_target(task.target))
    except Exception as e:  # noqa: BLE001 - any build failure disqualifies the candidate
        return EvalOutcome(Record(**base, status="failed",
                                  reason=f"build: {type(e).__name__}: {e}"[:500]), fatal=is_fatal(e))
    try:
        inputs, ref = _inputs_and_reference(task, factory)
        kind = kind_of(problem)
        outs = [kind.poisoned(problem, device) for _ in inputs]
        runs = [(lambda x=x, o=o: kind.run(launch, x, o)) for x, o in zip(inputs, outs)]
        results: list[torch.Tensor] = []
        # the first run compiles (Triton JITs on first launch) and is the correctness check; on
        # the CPU it is also a fair first sample of the candidate's time
        first = timer(lambda: results.append(runs[0]()), device, warmup=0, rep=1, budget_ms=0.0)
        result = results[0]
    except BaseException as e:  # noqa: BLE001 - MemoryError and friends included
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return EvalOutcome(Record(**base, status="failed",
                                  reason=f"run: {type(e).__name__}: {e}"[:500]), fatal=is_fatal(e))
    compile_s = time.perf_counter() - t0
    if on_compiled is not None:
        on_compiled(compile_s)
    err, tol = kind_of(problem).error(problem, result, ref(), config.allow_tf32) if config.check_candidates \
        else (None, 0.0)
    if err is not None and not err <= tol:
        return EvalOutcome(Record(**base, status="wrong", rel_err=err,
                                  reason=f"relative error {err:.3g} > tolerance {tol:.0e}"), compile_s)
    best = task.best_ms
    abort_at = best * config.bench_abort_ratio if best is not None else None
    if device.type == "cpu" and abort_at is not None and first.median_ms > abort_at:
        return EvalOutcome(Record(**base, status="aborted", median_ms=first.median_ms, reps=1,
                                  rel_err=err,
                                  reason=f"first run {first.median_ms:.3g} ms vs best {best:.3g} ms"),
                           compile_s)
    try:
        timing = timer(runs, device, warmup=max(config.bench_warmup - 1, 0), rep=config.bench_rep,
                       budget_ms=config.bench_budget_ms, abort_above_ms=abort_at,
                       min_rep=config.bench_min_rep, stable_pct=config.bench_stable_pct)
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return EvalOutcome(Record(**base, status="failed",
                                  reason=f"timing: {type(e).__name__}: {e}"[:500]),
                           compile_s, fatal=is_fatal(e))
    status = "aborted" if timing.aborted else "ok"
    return EvalOutcome(Record(
        **base, status=status, median_ms=timing.median_ms, spread_ms=timing.spread_ms,
        reps=timing.reps, rel_err=err,
        reason="slower than the best by more than the abort ratio" if timing.aborted else ""),
        compile_s)
