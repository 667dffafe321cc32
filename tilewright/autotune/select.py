"""Choosing a kernel for a problem: policy → cache → check and benchmark → deterministic pick.

For each candidate the policy proposes (ATen first, then generated kernels by predicted time)
that the cache has no record of: build it, run it once on fresh random inputs into an output
poisoned with NaN, compare with the float64 reference, then time it. A candidate that fails to
build or run, or whose error exceeds the dtype's tolerance, is recorded with the reason and can
never win. A candidate whose first run is ``config.bench_abort_ratio`` times slower than the
best so far is not timed further (it cannot win): this is what keeps tuning interpreted Triton
kernels on the CPU cheap.

Winner: the fastest checked candidate, except that candidates within measurement noise of the
fastest count as tied, and a tie goes to the lowest policy rank (ATen, then the cost model's
order). "Within noise" means a median difference of at most twice the larger of the two spreads
(half interquartile ranges), and never less than ``config.bench_tie_pct`` percent of the best
median. Near-equal kernels therefore do not flip between processes: the same ranking wins.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from tilewright._config import config
from tilewright.autotune.bench import time_callable
from tilewright.autotune.cache import ProblemKey, Record, TuningCache, default_cache
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.inputs import (
    GemmInputs, make_inputs, poisoned_output, rel_error, tolerance,
)
from tilewright.autotune.policy import policy_for
from tilewright.errors import NoValidCandidateError
from tilewright.problem import GemmProblem
from tilewright.runtime.targets import Target

log = logging.getLogger("tilewright.autotune")

Launcher = Callable[..., torch.Tensor]


class KernelFactory(Protocol):
    """Builds runnable kernels for candidates; the autotuner never renders source itself."""

    def build(self, problem: GemmProblem, candidate: Candidate, target: Target) -> Launcher:
        """``launch(a, b, *epilogue_inputs, out=None) -> out`` for the candidate."""

    def reference(self, problem: GemmProblem, inputs: GemmInputs) -> torch.Tensor:
        """The float64 result for ``inputs``."""


@dataclass
class CandidateResult:
    candidate: Candidate
    record: Record
    from_cache: bool = False


@dataclass
class Selection:
    """The chosen candidate and what was learned about every candidate considered."""

    problem: GemmProblem
    target: Target
    winner: Candidate
    results: list[CandidateResult] = field(default_factory=list)
    reason: str = ""
    measured: bool = True
    seconds: float = 0.0

    @property
    def winner_record(self) -> Record | None:
        for r in self.results:
            if r.candidate == self.winner:
                return r.record
        return None

    @property
    def tried(self) -> int:
        return len(self.results)


def filter_forced(candidates: list[Candidate]) -> tuple[list[Candidate], str]:
    """Apply ``config.force_backend``; a forced backend that cannot serve the problem falls
    back to ATen, with the reason returned."""
    force = config.force_backend
    if force == "auto":
        return candidates, ""
    if force == "aten":
        return [c for c in candidates if c.backend == "aten"], "forced aten"
    kept = [c for c in candidates if c.backend == force]
    if not kept:
        return [c for c in candidates if c.backend == "aten"], (
            f"force_backend={force!r} but no {force} template supports this problem: ATen")
    return kept, f"forced {force}"


def _measurable(target: Target) -> torch.device | None:
    """The local device to benchmark ``target`` on, or None when it is not this machine."""
    if target.backend == "cpu":
        return torch.device("cpu")
    if target.backend in ("cuda", "hip") and torch.cuda.is_available():
        from tilewright.runtime.targets import detect_target

        dev = torch.device("cuda", torch.cuda.current_device())
        if detect_target(dev).name == target.name:
            return dev
    return None


def pick_winner(results: list[CandidateResult]) -> CandidateResult | None:
    """Fastest checked result; results within noise of it tie, and a tie goes to the lowest rank.

    "aborted" results count: they passed the check and have a (single-run) time, they were
    only too slow to be worth timing again.
    """
    ok = [r for r in results
          if r.record.status in ("ok", "aborted") and r.record.median_ms is not None]
    if not ok:
        return None
    best = min(ok, key=lambda r: (r.record.median_ms, r.candidate.rank))
    floor = best.record.median_ms * config.bench_tie_pct / 100

    def noise(r: CandidateResult) -> float:
        return max(2 * max(best.record.spread_ms or 0.0, r.record.spread_ms or 0.0), floor)

    ties = [r for r in ok if r.record.median_ms - best.record.median_ms <= noise(r)]
    return min(ties, key=lambda r: (r.candidate.rank, r.record.median_ms))


def _evaluate(problem: GemmProblem, cand: Candidate, target: Target, factory: KernelFactory,
              device: torch.device, inputs: GemmInputs, ref: Callable[[], torch.Tensor],
              best_ms: float | None) -> Record:
    base = dict(template_id=cand.template_id, template_hash=cand.template_hash,
                params=cand.param_dict)
    try:
        launch = factory.build(problem, cand, target)
    except Exception as e:  # noqa: BLE001 - any build failure disqualifies the candidate
        return Record(**base, status="failed", reason=f"build: {type(e).__name__}: {e}"[:500])
    out = poisoned_output(problem, device)

    def run() -> torch.Tensor:
        return launch(inputs.a, inputs.b, *inputs.epilogue_inputs, out=out, **inputs.scale_kwargs)

    results: list[torch.Tensor] = []
    try:
        # the first run is the correctness check; on the CPU (nothing to compile) it is also a
        # fair first sample of the candidate's time
        first = time_callable(lambda: results.append(run()), device, warmup=0, rep=1,
                              budget_ms=0.0)
        result = results[0]
    except Exception as e:  # noqa: BLE001
        return Record(**base, status="failed", reason=f"run: {type(e).__name__}: {e}"[:500])
    err = rel_error(result, ref()) if config.check_candidates else None
    tol = tolerance(problem, config.allow_tf32)
    if err is not None and not err <= tol:
        return Record(**base, status="wrong", rel_err=err,
                      reason=f"relative error {err:.3g} > tolerance {tol:.0e}")
    abort_at = best_ms * config.bench_abort_ratio if best_ms is not None else None
    if device.type == "cpu" and abort_at is not None and first.median_ms > abort_at:
        return Record(**base, status="aborted", median_ms=first.median_ms, reps=1, rel_err=err,
                      reason=f"first run {first.median_ms:.3g} ms vs best {best_ms:.3g} ms")
    try:
        timing = time_callable(run, device, warmup=max(config.bench_warmup - 1, 0),
                               rep=config.bench_rep, budget_ms=config.bench_budget_ms,
                               abort_above_ms=abort_at)
    except Exception as e:  # noqa: BLE001
        return Record(**base, status="failed", reason=f"timing: {type(e).__name__}: {e}"[:500])
    status = "aborted" if timing.aborted else "ok"
    return Record(**base, status=status, median_ms=timing.median_ms, spread_ms=timing.spread_ms,
                  reps=timing.reps, rel_err=err,
                  reason="slower than the best by more than the abort ratio" if timing.aborted else "")


def select_gemm(problem: GemmProblem, target: Target, factory: KernelFactory, *,
                cache: TuningCache | None = None, seed: int = 0) -> Selection:
    """Choose a kernel for ``problem`` on ``target`` (see the module docstring).

    Safe to call while a compiler traces: fake-tensor and other dispatch modes are switched off
    so candidates run on real tensors.
    """
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch.no_grad():
        return _select_gemm(problem, target, factory, cache=cache, seed=seed)


def _select_gemm(problem: GemmProblem, target: Target, factory: KernelFactory, *,
                 cache: TuningCache | None = None, seed: int = 0) -> Selection:
    """Choose a kernel for ``problem`` on ``target``.

    Measures on this machine when it has the target (always for ``cpu``); otherwise (ahead of
    time for another chip) picks the generated candidate the cost model ranks first.

    Raises:
        NoValidCandidateError: no candidate, ATen included, could be built and run.
    """
    t_start = time.perf_counter()
    candidates, reason = filter_forced(policy_for("gemm", target).candidates(problem, target))
    device = _measurable(target)
    if device is None:
        generated = [c for c in candidates if c.backend != "aten"] or candidates
        winner = min(generated, key=lambda c: (c.predicted_ms or 0.0, c.rank))
        return Selection(problem, target, winner, [], reason or "predicted (target not local)",
                         measured=False, seconds=time.perf_counter() - t_start)
    if not config.autotune or len(candidates) == 1:
        candidates = candidates[:1]
        reason = reason or ("autotune off: policy's first choice" if not config.autotune else "")

    cache = cache if cache is not None else default_cache()
    key = ProblemKey.for_problem(problem, target.name)
    known = cache.lookup(key)
    results: list[CandidateResult] = []
    new: dict[str, Record] = {}
    inputs: GemmInputs | None = None
    ref_cache: list[torch.Tensor] = []

    def ref() -> torch.Tensor:
        if not ref_cache:
            ref_cache.append(factory.reference(problem, inputs))  # type: ignore[arg-type]
        return ref_cache[0]

    best_ms: float | None = None
    for cand in sorted(candidates, key=lambda c: c.rank):
        rec = known.get(cand.key)
        if rec is not None:
            results.append(CandidateResult(cand, rec, from_cache=True))
        else:
            if inputs is None:
                inputs = make_inputs(problem, device, seed)
            rec = _evaluate(problem, cand, target, factory, device, inputs, ref, best_ms)
            new[cand.key] = rec
            results.append(CandidateResult(cand, rec))
            if rec.status != "ok":
                log.info("candidate %s for %s: %s (%s)", cand.name, problem.describe(),
                         rec.status, rec.reason)
        if rec.status in ("ok", "aborted") and rec.median_ms is not None:
            best_ms = rec.median_ms if best_ms is None else min(best_ms, rec.median_ms)
    if new:
        cache.store(key, new)

    chosen = pick_winner(results)
    if chosen is None:
        aten = [r for r in results if r.candidate.backend == "aten" and r.record.status != "failed"]
        if not aten:
            reasons = "; ".join(f"{r.candidate.name}: {r.record.reason}" for r in results)
            raise NoValidCandidateError(f"no candidate works for {problem.describe()}: {reasons}")
        chosen = aten[0]
        reason = "no candidate passed its check; ATen is the fallback"
    elif not reason:
        timed = [r for r in results if r.record.status in ("ok", "aborted")]
        reason = "fastest" if len(timed) > 1 else "only valid candidate"
    return Selection(problem, target, chosen.candidate, results, reason, measured=True,
                     seconds=time.perf_counter() - t_start)
