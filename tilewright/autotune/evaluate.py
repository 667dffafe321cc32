"""Evaluating one candidate for one problem: build, check against the reference, time.

The same function runs in the tuning process (ATen, and everything when isolation is off) and in
the worker processes of :mod:`tilewright.autotune.pool`. A candidate that fails to build or run,
or whose error exceeds the dtype's tolerance, gets a record saying why and can never win.

Inputs are random normal tensors with the problem's layouts, made from ``seed`` (so every process
makes the same ones), in ``config.bench_input_sets`` sets that timing cycles through. Each
candidate writes its own output buffers, freshly filled with NaN, so an element it fails to write
shows up in the check, which compares with the float64 reference before any time counts.

Candidates of one problem share the inputs, so each is verified to leave them as it found them
(a fingerprint of every input's bytes, before and after): a kernel that writes into its inputs
fails its own check, and the next candidate gets fresh ones, instead of that kernel passing and
the next one failing against inputs it never saw.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from tilewright._config import config
from tilewright.autotune.bench import time_callable
from tilewright.autotune.cache import Record
from tilewright.autotune.candidates import Candidate
from tilewright.kinds import ProblemKind, kind_of
from tilewright.runtime.targets import get_target

_log = logging.getLogger(__name__)

# errors after which a process's device state cannot be trusted (a worker is replaced)
_FATAL_TYPES = ("OutOfMemoryError", "MemoryError", "AcceleratorError")
_FATAL_TEXT = ("CUDA error", "HIP error", "illegal memory access", "out of memory",
               "device-side assert")
_OOM_TYPES = ("OutOfMemoryError", "MemoryError")


@dataclass(frozen=True)
class EvalTask:
    """One candidate to evaluate for one problem on one local device.

    ``best_ms``: the best median seen so far for this problem (a CPU candidate whose first run
    is ``config.bench_abort_ratio`` times slower is not timed further); ``device``: a torch
    device string ("cpu", "cuda:1").
    """

    problem: Any  # a problem of any registered kind (tilewright.kinds)
    candidate: Candidate
    target: str
    device: str
    seed: int = 0
    best_ms: float | None = None


@dataclass
class EvalOutcome:
    """A record, the seconds building plus the first (compiling) run took when it got that far,
    whether the process's device state is now suspect (CUDA error, OOM), and whether the failure
    was this machine's state rather than the candidate's (out of memory: the record is not kept,
    so the candidate is tried again another time)."""

    record: Record
    compile_s: float | None = None
    fatal: bool = False
    transient: bool = False


def is_fatal(e: BaseException) -> bool:
    """True for errors that may leave the device unusable in this process (CUDA errors, OOM)."""
    text = str(e)
    return type(e).__name__ in _FATAL_TYPES or any(t in text for t in _FATAL_TEXT)


def is_out_of_memory(e: BaseException) -> bool:
    """True for host or device out-of-memory errors."""
    return type(e).__name__ in _OOM_TYPES or "out of memory" in str(e)


def _slow_first_call(template_id: str) -> bool:
    """Whether the template says its kernels' first call sets something up (so that call's time
    is no fair sample of the rest)."""
    from tilewright.templates import get_template  # the templates import the autotuner

    try:
        return bool(getattr(get_template(template_id), "slow_first_call", False))
    except KeyError:
        return False


def _failed(base: dict[str, Any], stage: str, e: BaseException, compile_s: float | None = None) -> EvalOutcome:
    if config.strict and isinstance(e, (NameError, SyntaxError)):
        # a candidate whose generated source is not valid Python is our bug, not the problem's:
        # it is only ever marked failed, and another candidate wins, so say so where it shows
        _log.warning("%s %s: generated code is broken (a template bug): %s: %s",
                     base["template_id"], base["params"], type(e).__name__, e)
    return EvalOutcome(Record(**base, status="failed", reason=f"{stage}: {type(e).__name__}: {e}"[:500]),
                       compile_s, fatal=is_fatal(e), transient=is_out_of_memory(e))


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in _tensors(getattr(obj, f.name))]
    return []


_CHUNK = 1 << 22  # words per step: fingerprinting a 1 GiB weight needs 32 MiB at a time


def fingerprint(inputs: Any) -> tuple[int, ...]:
    """A position-weighted sum (modulo 2^64) of the words of every storage the inputs view
    (each storage once and all of it, so stride-0 and strided views are covered). The weights
    are odd, so a change of any one word changes it; it reads each byte once (memory-bound)."""
    out, seen = [], set()
    for t in _tensors(inputs):
        st = t.untyped_storage()
        if st.data_ptr() in seen or st.nbytes() == 0:
            continue
        seen.add(st.data_ptr())
        raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(st)
        words = next(raw.view(dt) for dt, n in ((torch.int64, 8), (torch.int32, 4), (torch.uint8, 1))
                     if st.nbytes() % n == 0)
        weights = _weights(min(_CHUNK, words.numel()), t.device)
        total = 0
        for i in range(0, words.numel(), _CHUNK):
            c = words[i:i + _CHUNK].to(torch.int64)
            # a dot product wraps modulo 2^64 as the product's sum did, without the product
            total += int(torch.dot(c, weights[:c.numel()]))
            total += 2 * i * int(c.sum())
        out.append(total % (1 << 64))
    return tuple(out)


_weight_cache: dict[torch.device, torch.Tensor] = {}


def _weights(n: int, device: torch.device) -> torch.Tensor:
    """The odd weights 1, 3, 5, ... (at least ``n`` of them) on ``device``, made once and kept
    (at most one chunk, 32 MiB) instead of per storage and call."""
    w = _weight_cache.get(device)
    if w is None or w.numel() < n:
        w = _weight_cache[device] = torch.arange(max(n, 1 << 16), dtype=torch.int64, device=device) * 2 + 1
    return w


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
        _last["prints"] = [fingerprint(x) for x in _last["inputs"]]
        _last["key"] = key

    def ref() -> torch.Tensor:
        if "ref" not in _last:
            _last["ref"] = factory.reference(task.problem, _last["inputs"][0])
        return _last["ref"]

    return _last["inputs"], ref


def forget_inputs() -> None:
    """Drop the cached inputs and reference (frees device memory)."""
    _last.clear()


def _special_values_wrong(task: EvalTask, factory: Any, launch: Callable) -> str | None:
    """Why the candidate fails the kind's second check, on special values (inf, NaN, +-0,
    subnormals: ``ProblemKind.special_inputs``), or None. Skipped when checking is off, for kinds
    without such inputs, and where the factory finds no one answer to judge by
    (``factory.special_reference`` None: the problem's torch form, computing as eager does,
    disagrees with the float64 reference there)."""
    kind = kind_of(task.problem)
    judge = getattr(factory, "special_reference", None)  # a simulated factory may have none
    if judge is None or not config.check_candidates:
        return None
    device = torch.device(task.device)
    try:
        ref = _special_reference(task, judge)
        if ref is None:
            return None
        # the inputs are made once per problem and copied for each candidate (storage and
        # layout alike), so none sees another's writes
        x = copy.deepcopy(_last["special_inputs"])
        result = kind.run(launch, x, kind.poisoned(task.problem, device))
        err, tol = kind.error(task.problem, result, ref, config.allow_tf32)
    except Exception as e:  # noqa: BLE001 - a kernel that fails on them is wrong on them
        return f"with special values (inf, NaN, +-0, subnormals): {type(e).__name__}: {e}"[:500]
    if err <= tol:
        return None
    return f"with special values (inf, NaN, +-0, subnormals): relative error {err:.3g} > tolerance {tol:.0e}"


def _wrong_as_called(kind: Any, problem: Any, timed_run: Callable[[], Any], ref: Callable[[], Any]) -> str | None:
    """Why the candidate's result is wrong when it runs as the compiled graph calls it (its
    kind's ``run_timed``: on a CPU the launcher allocates its outputs), or None. The first check
    writes into poisoned outputs; a launcher whose own allocation path is wrong (a layout, an
    output it leaves unwritten) would pass it, be timed on that path and run on it in the graph.
    Skipped when checking is off and for kinds that time the checked call itself."""
    if not config.check_candidates or type(kind).run_timed is ProblemKind.run_timed:
        return None
    try:
        err, tol = kind.error(problem, timed_run(), ref(), config.allow_tf32)
    except Exception as e:  # noqa: BLE001 - a kernel that fails as called is wrong as called
        return f"run as the graph calls it (allocating its outputs): {type(e).__name__}: {e}"[:500]
    if err <= tol:
        return None
    return f"run as the graph calls it (allocating its outputs): relative error {err:.3g} > tolerance {tol:.0e}"


UNTOUCHED = ("; the output tensors it was handed (filled with NaN) are untouched: a kernel must write its "
             "result into the outputs it is given (``out``/``outs``), in place; returning a new tensor instead "
             "is not the calling convention")


def untouched_outputs_hint(given: Any, result: Any) -> str:
    """A hint for a wrong result: :data:`UNTOUCHED` when every float output tensor the launcher
    was handed (``given``, the kind's poisoned outputs) still holds only NaN after the run (the
    kernel wrote nothing into them, whatever it returned as ``result``), else "". A kernel
    with the wrong calling convention then fails its first check naming the fix, rather than
    with a bare infinite error."""
    tensors = [t for t in (given if isinstance(given, (tuple, list)) else (given,))
               if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
    if not tensors or not all(bool(torch.isnan(t).all()) for t in tensors):
        return ""
    return UNTOUCHED


def _special_reference(task: EvalTask, judge: Callable) -> Any:
    """The special-value inputs (kept in ``_last``) and their reference, made once per problem."""
    key = (task.problem, task.device, task.seed)
    if _last.get("special_key") != key:
        pristine = kind_of(task.problem).special_inputs(task.problem, torch.device(task.device), task.seed)
        ref = None if pristine is None else judge(task.problem, copy.deepcopy(pristine))
        _last["special_key"], _last["special_inputs"], _last["special_ref"] = key, pristine, ref
    return _last["special_ref"]


def prepare_checks(task: EvalTask, factory: Any) -> None:
    """Make now what checking ``task``'s problem needs and :func:`evaluate` would make at its
    first candidate (inputs, the reference, the special-value reference; each made once per
    problem), so that it overlaps with candidates building in the background. Nothing is timed
    here; a failure is left for :func:`evaluate` to meet and report."""
    if not config.check_candidates:
        return
    try:
        _, ref = _inputs_and_reference(task, factory)
        ref()
        judge = getattr(factory, "special_reference", None)
        if judge is not None:
            _special_reference(task, judge)
    except Exception:  # noqa: BLE001 - evaluate() meets it again, as the candidate's record
        pass


def _scribbled(inputs: list[Any], upto: int) -> bool:
    """Whether the first ``upto`` input sets differ from their fingerprints; if so the shared
    inputs are dropped, so the next candidate gets fresh ones."""
    if any(fingerprint(x) != p for x, p in zip(inputs[:upto], _last.get("prints", []))):
        forget_inputs()
        return True
    return False


_SCRIBBLED = "wrote into its input tensors (a kernel must leave its inputs as they were)"


def evaluate(task: EvalTask, factory: Any,
             on_compiled: Callable[[float], None] | None = None, *, timed: bool = True) -> EvalOutcome:
    """Build, check and time ``task.candidate``; never raises for the candidate's faults.

    Args:
        task: what to evaluate, where.
        factory: a :class:`~tilewright.autotune.select.KernelFactory`; a simulated device's
            factory may carry its own clock as ``factory.timer`` (same signature as
            :func:`~tilewright.autotune.bench.time_callable`).
        on_compiled: called with the seconds build + first run took, before timing starts
            (the worker pool switches from its compile timeout to its run timeout there).
        timed: False to stop after the check (autotune off): an "ok" record without a time.
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
        return _failed(base, "build", e)
    try:
        inputs, ref = _inputs_and_reference(task, factory)
        kind = kind_of(problem)
        outs = [kind.poisoned(problem, device) for _ in inputs]
        runs = [(lambda x=x, o=o: kind.run(launch, x, o)) for x, o in zip(inputs, outs)]
        # timed as the graph calls it (the first run, into poisoned outputs, is the check)
        timed_runs = [(lambda x=x, o=o: kind.run_timed(launch, x, o)) for x, o in zip(inputs, outs)]
        results: list[torch.Tensor] = []
        # the first run compiles (Triton JITs on first launch) and is the correctness check; on
        # the CPU it is also a fair first sample of the candidate's time
        if timed:
            first = timer(lambda: results.append(runs[0]()), device, warmup=0, rep=1, budget_ms=0.0)
        else:
            results.append(runs[0]())
        result = results[0]
    except BaseException as e:  # noqa: BLE001 - MemoryError and friends included
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        forget_inputs()  # it may have written into them before it failed: the next gets fresh ones
        return _failed(base, "run", e)
    compile_s = time.perf_counter() - t0
    if on_compiled is not None:
        on_compiled(compile_s)
    if _scribbled(inputs, 1):
        return EvalOutcome(Record(**base, status="wrong", reason=_SCRIBBLED), compile_s)
    try:
        err, tol = kind.error(problem, result, ref(), config.allow_tf32) if config.check_candidates \
            else (None, 0.0)
    except BaseException as e:  # noqa: BLE001 - the reference ran out of memory, say
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        # the reference's failure says nothing about the candidate: not kept, so a fixed
        # reference judges it again (a kept "failed" would outlive the fix)
        out = _failed(base, "reference", e, compile_s)
        return dataclasses.replace(out, transient=True)
    if err is not None and not err <= tol:
        reason = f"relative error {err:.3g} > tolerance {tol:.0e}" + untouched_outputs_hint(outs[0], result)
        return EvalOutcome(Record(**base, status="wrong", rel_err=err, reason=reason), compile_s)
    why = _special_values_wrong(task, factory, launch) or _wrong_as_called(kind, problem, timed_runs[0], ref)
    if why:
        return EvalOutcome(Record(**base, status="wrong", rel_err=err, reason=why), compile_s)
    if not timed:
        return EvalOutcome(Record(**base, status="ok", rel_err=err, reason="checked, untimed"), compile_s)
    best = task.best_ms
    abort_at = best * config.bench_abort_ratio if best is not None else None
    # the first run is a fair sample for CPU kernels, except where the target's device is slow
    # to launch a kernel the first time (Target.slow_first_launch: those are judged after the
    # warm-up, by the timer's own abort); and ATen ones: the first call of an ATen overload
    # from Python sets up its binding (~0.2 ms each, measured; an unfused program calls several),
    # and a template's that says its first call sets something up (``slow_first_call``: oneDNN
    # builds its primitive, ~18 ms for a 64x1024x256 linear, measured). A first run over the
    # line gets a second, timed as the graph calls it, before it aborts: the first may have paid
    # what the process pays once (the first C++ kernel of a process starts OpenMP and pages in
    # its library: 16 ms where the kernel takes 0.016 ms, in the demo Llama's first loop kernel,
    # which ATen's 0.24 ms then beat)
    if (device.type == "cpu" and abort_at is not None and first.median_ms > abort_at
            and not get_target(task.target).slow_first_launch and cand.backend != "aten"
            and not _slow_first_call(cand.template_id)):
        try:
            second = timer(timed_runs[0], device, warmup=0, rep=1, budget_ms=0.0)
        except BaseException as e:  # noqa: BLE001 - as a failure of the timed runs below
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            forget_inputs()
            return _failed(base, "timing", e, compile_s)
        if second.median_ms > abort_at:
            return EvalOutcome(Record(**base, status="aborted", median_ms=second.median_ms, reps=1,
                                      rel_err=err,
                                      reason=f"first runs {first.median_ms:.3g} and {second.median_ms:.3g} ms "
                                             f"vs best {best:.3g} ms"), compile_s)
    try:
        timing = timer(timed_runs, device, warmup=max(config.bench_warmup - 1, 0), rep=config.bench_rep,
                       budget_ms=config.bench_budget_ms, abort_above_ms=abort_at,
                       min_rep=config.bench_min_rep, stable_pct=config.bench_stable_pct)
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        forget_inputs()
        return _failed(base, "timing", e, compile_s)
    if _scribbled(inputs, len(inputs)):  # a kernel that writes its inputs only now and then
        return EvalOutcome(Record(**base, status="wrong", rel_err=err, reason=_SCRIBBLED), compile_s)
    status = "aborted" if timing.aborted else "ok"
    return EvalOutcome(Record(
        **base, status=status, median_ms=timing.median_ms, spread_ms=timing.spread_ms,
        reps=timing.reps, rel_err=err,
        reason="slower than the best by more than the abort ratio" if timing.aborted else ""),
        compile_s)
