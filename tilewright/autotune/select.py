"""Choosing a kernel for a problem: policy → cache → check and benchmark → deterministic pick.

For each candidate the policy proposes (ATen first, then generated kernels by predicted time)
that the cache has no record of, :func:`~tilewright.autotune.evaluate.evaluate` builds it, runs
it once into an output poisoned with NaN, compares with the float64 reference, then times it. A
candidate that fails to build or run, or whose error exceeds the dtype's tolerance, is recorded
with the reason and can never win. A candidate whose first run is ``config.bench_abort_ratio``
times slower than the best so far is not timed further (it cannot win): this is what keeps
tuning interpreted Triton kernels on the CPU cheap.

Generated candidates run in worker processes when ``config.isolate`` says so ("auto": on GPUs),
so a crash, hang or OOM disqualifies only that candidate (:mod:`tilewright.autotune.pool`). ATen
always runs in the tuning process: it is the fallback and needs no protection.

Winner: the fastest checked candidate, except that candidates within measurement noise of the
fastest count as tied, and a tie goes to the lowest policy rank (ATen, then the cost model's
order; equal ranks by candidate key). "Within noise" means a median difference of at most twice
the larger of the two spreads (half interquartile ranges), never less than
``config.bench_tie_pct`` percent of the best median and never more than ``TIE_CAP`` (25%) of
it. Near-equal kernels therefore do not flip between processes: the same ranking wins. Beyond that, the winner is picked from the records
every process stored, and the first decision recorded for a problem stands
(:meth:`~tilewright.autotune.cache.TuningCache.store`): the ranks of one job that tuned the same
problem at once run the same kernel.

With ``config.autotune`` off nothing is timed or recorded: the policy's first choice is used, a
generated one after a single check against the reference.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from tilewright._config import config, forced_languages
from tilewright.autotune.cache import ProblemKey, Record, TuningCache, default_cache
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.evaluate import EvalOutcome, EvalTask, evaluate, forget_inputs, prepare_checks
from tilewright.kinds import kind_name, kind_of, policy_for
from tilewright.autotune.pool import WorkerPool, acquire_pool
from tilewright.errors import NoValidCandidateError
from tilewright.runtime.targets import Target

log = logging.getLogger("tilewright.autotune")

Launcher = Callable[..., torch.Tensor]


class KernelFactory(Protocol):
    """Builds runnable kernels for candidates; the autotuner never renders source itself."""

    def build(self, problem: Any, candidate: Candidate, target: Target) -> Launcher:
        """The candidate's launcher: ``launch(a, b, *epilogue_inputs, out=None) -> out`` for a
        GEMM, ``launch(*inputs, *sizes, outs=None) -> outs`` for a loop kernel."""

    def reference(self, problem: Any, inputs: Any) -> Any:
        """The float64 result(s) for ``inputs``."""

    # A simulated device may also carry its own clock: ``timer(fns, device, **kw) -> Timing``
    # with the signature of :func:`tilewright.autotune.bench.time_callable`.


@dataclass
class CandidateResult:
    candidate: Candidate
    record: Record
    from_cache: bool = False


@dataclass
class Selection:
    """The chosen candidate and what was learned about every candidate considered."""

    problem: Any  # a problem of any registered kind (tilewright.kinds)
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
    """Apply ``config.force_backend`` (one language, or several comma-separated: their templates
    compete); forced languages that cannot serve the problem fall back to ATen, with the reason
    returned."""
    force = config.force_backend
    if force == "auto":
        return candidates, ""
    if force == "aten":
        return [c for c in candidates if c.backend == "aten"], "forced aten"
    forced = forced_languages(force)
    kept = [c for c in candidates if c.backend in forced]
    if not kept:
        return [c for c in candidates if c.backend == "aten"], (
            f"force_backend={force!r} but no {force} template supports this problem: ATen")
    return kept, f"forced {force}"


def _measurable(target: Target) -> torch.device | None:
    """The local device to benchmark ``target`` on, or None when it is not this machine (the
    target knows its device and its quirks: :meth:`~tilewright.runtime.targets.Target.local_device`)."""
    return target.local_device()


def _timed(results: list[CandidateResult]) -> list[CandidateResult]:
    return [r for r in results
            if r.record.status in ("ok", "aborted") and r.record.median_ms is not None]


# a median this share above the best's is a slower kernel, not noise: a spread wider than that
# is interference (preempted runs on a busy CPU), which says nothing about the kernel
TIE_CAP = 0.25


def _order(r: CandidateResult) -> tuple:
    # the documented tie rule: lowest policy rank, then the candidate key (a stable string)
    return (r.candidate.rank, r.candidate.key)


def tied_with_best(results: list[CandidateResult]) -> tuple[CandidateResult | None, list[CandidateResult]]:
    """The fastest checked result and every result within noise of it (itself included).

    "Within noise": a median at most max(2 x the larger spread of the two,
    ``config.bench_tie_pct`` % of the best median) above the best, and never more than
    :data:`TIE_CAP` above it, however wide the spreads: on a busy CPU preempted runs gave ATen
    programs spreads of 24 ms on a 2.4 ms median and 2.8 ms on 0.93 ms, which "tied" them with
    C++ kernels of 0.15 ms and 0.58 ms (RMSNorm 256x4096, softmax 1024x1024) and won on rank.
    "aborted" results count: they passed the check and have a (single-run) time, they were
    only too slow to time again.
    """
    ok = _timed(results)
    if not ok:
        return None, []
    best = min(ok, key=lambda r: (r.record.median_ms, *_order(r)))
    floor = best.record.median_ms * config.bench_tie_pct / 100

    def noise(r: CandidateResult) -> float:
        return max(2 * max(best.record.spread_ms or 0.0, r.record.spread_ms or 0.0), floor)

    cap = best.record.median_ms * (1 + TIE_CAP)
    return best, [r for r in ok if r.record.median_ms - best.record.median_ms <= noise(r)
                  and (r is best or r.record.median_ms <= cap)]


def pick_winner(results: list[CandidateResult]) -> CandidateResult | None:
    """Fastest checked result; results within noise of it tie, and a tie goes to the lowest
    policy rank (then the lowest candidate key), so every process picks the same one."""
    _, ties = tied_with_best(results)
    return min(ties, key=_order) if ties else None


def why_winner(results: list[CandidateResult], winner: CandidateResult) -> str:
    """One sentence on why ``winner`` won: clearly fastest, or tied and lowest rank."""
    best, ties = tied_with_best(results)
    timed = _timed(results)
    if best is None or winner not in ties:
        return "no candidate passed its check and timing"
    if len(timed) == 1:
        return "only valid candidate"
    ms = winner.record.median_ms
    others = [r for r in ties if r is not winner]
    if others:
        names = ", ".join(f"{r.candidate.name} ({r.record.median_ms:.4g} ms)" for r in others)
        return (f"tied within noise with {names}; the tie goes to the lowest policy rank "
                f"(rank {winner.candidate.rank})")
    rest = [r for r in timed if r is not winner]
    runner = min(rest, key=lambda r: r.record.median_ms)
    ratio = runner.record.median_ms / ms if ms > 0 else float("inf")
    lead = f"{ratio:.1f}x faster than" if ratio >= 2 else f"{(ratio - 1) * 100:.1f}% ahead of"
    return (f"fastest: {ms:.4g} ± {winner.record.spread_ms or 0:.2g} ms, {lead} "
            f"{runner.candidate.name} ({runner.record.median_ms:.4g} ms), beyond the noise")


def local_devices(target: Target) -> list[str]:
    """Devices of this machine that are ``target`` ("cuda:0", ...; ["cpu"] for the CPU):
    :meth:`~tilewright.runtime.targets.Target.local_devices`."""
    return target.local_devices()


def isolated(device: torch.device) -> bool:
    """Whether generated candidates run in worker processes (``config.isolate``)."""
    return config.isolate == "on" or (config.isolate == "auto" and device.type != "cpu")


def select(problem: Any, target: Target, factory: KernelFactory, *,
           cache: TuningCache | None = None, seed: int = 0,
           pool: WorkerPool | None = None) -> Selection:
    """Choose a kernel for ``problem`` (a GEMM or a loop kernel) on ``target`` (see the module
    docstring).

    Measures on this machine when it has the target (always for ``cpu``); otherwise (ahead of
    time for another chip) picks the generated candidate the cost model ranks first. Safe to
    call while a compiler traces: fake-tensor and other dispatch modes are switched off so
    candidates run on real tensors.

    Args:
        problem: a problem of any registered kind (:mod:`tilewright.kinds`: a
            :class:`~tilewright.kinds.gemm.problem.GemmProblem`, :class:`~tilewright.problem.LoopProblem`,
            ...), at concrete sizes (a dynamic problem at its bucket).
        target: the chip to choose for.
        factory: builds launchers (must be picklable when candidates run isolated).
        cache: the tuning cache (default: the one under ``config.cache_dir``).
        seed: seeds the random inputs.
        pool: worker pool for isolated candidates (default: the current
            :func:`~tilewright.autotune.pool.pool_scope`'s, or one for this call).

    Raises:
        NoValidCandidateError: no candidate, ATen included, could be built and run.
        TuningWorkerError: isolation is on and worker processes could not start.
    """
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch.no_grad():
        try:
            return _select(problem, target, factory, cache=cache, seed=seed, pool=pool)
        finally:
            forget_inputs()


select_gemm = select  # the name GEMM callers knew


def _untimed(problem: Any, candidates: list[Candidate]) -> bool:
    """A problem with only its ATen candidate (a loop kernel's torch form on a CPU not forcing
    Triton) has nothing to choose between: it is not measured and leaves no record, unless its
    kind times ATen alone (``tune_aten_alone``: GEMMs, whose ATen record `warm` ships)."""
    return len(candidates) == 1 and candidates[0].backend == "aten" and not kind_of(problem).tune_aten_alone


def leaves_no_record(problem: Any, target: Target) -> bool:
    """Whether :func:`select` chooses for ``problem`` without measuring (so the cache holds
    nothing for it, and needs nothing)."""
    candidates, _ = filter_forced(policy_for(kind_name(problem), target).candidates(problem, target))
    return _untimed(problem, candidates)


def to_build(problem: Any, target: Target, cache: TuningCache | None = None) -> list[Candidate]:
    """The generated candidates :func:`select` would build in this process for ``problem``: none
    when it measures nothing (one candidate, a target not here) or finds every record in the
    tuning cache; with ``config.autotune`` off, the policy's first choice when it is generated
    and checked. Candidates evaluated in worker processes are built there and not named."""
    device = _measurable(target)
    if device is None:
        return []
    candidates, _ = filter_forced(policy_for(kind_name(problem), target).candidates(problem, target))
    if _untimed(problem, candidates):
        return []
    if not config.autotune:
        first = min(candidates, key=lambda c: c.rank)
        return [first] if first.backend != "aten" and config.check_candidates else []
    cache = cache if cache is not None else default_cache()
    known = cache.lookup(ProblemKey.for_problem(problem, target.name))
    return [c for c in sorted(candidates, key=lambda c: c.rank)
            if c.key not in known and c.backend != "aten" and not isolated(device)]


def _first_choice(problem: Any, target: Target, factory: KernelFactory, candidates: list[Candidate],
                  proposed: list[Candidate], device: torch.device, seed: int, t_start: float,
                  reason: str) -> Selection:
    """Autotune off: the policy's first choice (of ``candidates``, after forcing), untimed and
    unrecorded. A generated kernel is still checked against the reference once (unless
    checking is off), and ATen (from ``proposed``, forced off or not) replaces it if it fails."""
    first = min(candidates, key=lambda c: c.rank)
    reason = reason or "autotune off: the policy's first choice, untimed"
    results: list[CandidateResult] = []
    if first.backend != "aten" and config.check_candidates:
        out = evaluate(EvalTask(problem, first, target.name, str(device), seed), factory, timed=False)
        results.append(CandidateResult(first, out.record))
        if out.record.status != "ok":
            aten = [c for c in proposed if c.backend == "aten"]
            if not aten:
                raise NoValidCandidateError(f"no candidate works for {problem.describe()}: "
                                            f"{first.name}: {out.record.reason}")
            first, reason = aten[0], f"autotune off and {first.name} failed its check; ATen is the fallback"
    return Selection(problem, target, first, results, reason, measured=False,
                     seconds=time.perf_counter() - t_start)


def _select(problem: Any, target: Target, factory: KernelFactory, *,
            cache: TuningCache | None, seed: int, pool: WorkerPool | None) -> Selection:
    t_start = time.perf_counter()
    proposed = policy_for(kind_name(problem), target).candidates(problem, target)
    candidates, reason = filter_forced(proposed)
    if _untimed(problem, candidates):
        return Selection(problem, target, candidates[0], [], reason or "only candidate", measured=False,
                         seconds=time.perf_counter() - t_start)
    device = _measurable(target)
    if device is None:
        generated = [c for c in candidates if c.backend != "aten"] or candidates
        winner = min(generated, key=lambda c: (c.predicted_ms or 0.0, c.rank))
        return Selection(problem, target, winner, [], reason or "predicted (target not local)",
                         measured=False, seconds=time.perf_counter() - t_start)
    if not config.autotune:
        return _first_choice(problem, target, factory, candidates, proposed, device, seed, t_start, reason)

    cache = cache if cache is not None else default_cache()
    key = ProblemKey.for_problem(problem, target.name)
    known = cache.lookup(key)
    ordered = sorted(candidates, key=lambda c: c.rank)
    records: dict[str, Record] = {c.key: known[c.key] for c in ordered if c.key in known}
    todo = [c for c in ordered if c.key not in known]
    here = [c for c in todo if c.backend == "aten" or not isolated(device)]
    away = [c for c in todo if c not in here]

    def best_ms() -> float | None:
        times = [r.median_ms for r in records.values()
                 if r.status in ("ok", "aborted") and r.median_ms is not None]
        return min(times, default=None)

    new: dict[str, Record] = {}

    def done(cand: Candidate, out: EvalOutcome) -> None:
        rec = out.record
        records[cand.key] = rec
        if not out.transient:  # out of memory here says nothing about the candidate
            new[cand.key] = rec
        if rec.status != "ok":
            log.info("candidate %s for %s: %s (%s)", cand.name, problem.describe(), rec.status,
                     rec.reason)

    generated = [c for c in here if c.backend != "aten"]  # what to_build() names, in rank order
    prepare = getattr(factory, "prepare", None)  # a simulated factory may have none
    if prepare is not None and generated:
        # the generated candidates' native code builds in the background (g++ runs in other
        # processes) while this thread makes the inputs and references; all of it is done
        # before anything is timed, so no timing shares the machine with a build
        wait = prepare(problem, generated, target)
        prepare_checks(EvalTask(problem, here[0], target.name, str(device), seed), factory)
        wait()
    elif here and getattr(factory, "settle", None) is not None:
        factory.settle()  # other problems' builds (a graph starts them all up front) end first
    for cand in here:  # ATen first (rank 0): its time is the bar the others must beat
        task = EvalTask(problem, cand, target.name, str(device), seed, best_ms())
        done(cand, evaluate(task, factory))
    if away:
        tasks = [EvalTask(problem, c, target.name, str(device), seed, best_ms()) for c in away]
        by_key = {c.key: c for c in away}
        cb = lambda task, out: done(by_key[task.candidate.key], out)  # noqa: E731
        if pool is not None:
            pool.evaluate(tasks, factory, cb)
        else:
            with acquire_pool(local_devices(target) or [str(device)]) as p:
                p.evaluate(tasks, factory, cb)

    def decide(stored: dict[str, Record]) -> str | None:
        mine = [CandidateResult(c, stored[c.key]) for c in ordered if c.key in stored]
        chosen = pick_winner(mine)
        return chosen.candidate.key if chosen else None

    # the decision comes from the stored records of every process, and the first one recorded
    # stands: ranks of one job that tuned the same problem run the same kernel
    decided = cache.store(key, new, decide) if new else cache.decision(key)
    records.update({ck: r for ck, r in cache.lookup(key).items() if ck in records})
    results = [CandidateResult(c, records[c.key], from_cache=c.key in known) for c in ordered]
    chosen = next((r for r in results if r.candidate.key == decided and r in _timed(results)), None)
    adopted = chosen is not None and chosen is not pick_winner(results)
    chosen = chosen or pick_winner(results)
    if chosen is None:
        aten = [r for r in results if r.candidate.backend == "aten" and r.record.status != "failed"]
        if not aten:
            reasons = "; ".join(f"{r.candidate.name}: {r.record.reason}" for r in results)
            raise NoValidCandidateError(f"no candidate works for {problem.describe()}: {reasons}")
        chosen = aten[0]
        reason = "no candidate passed its check; ATen is the fallback"
    elif adopted:
        reason = reason or "the decision recorded in the tuning cache (another process decided first)"
    elif not reason:
        reason = why_winner(results, chosen)
    return Selection(problem, target, chosen.candidate, results, reason, measured=True,
                     seconds=time.perf_counter() - t_start)
