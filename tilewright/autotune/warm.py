"""The offline cache warmer: tune a list of problems ahead of time, resumably.

``warm(problems, target, factory)`` tunes each problem (checking and timing every candidate
the cache has no record of) and records progress in a *state file* beside the cache, one per
plan (the list of problems and the target). Killed and started again with the same plan, it
skips the problems already finished, and within a problem the cache already holds the
candidates measured before. Locally the candidates of a problem are spread over one worker per
local GPU (:mod:`tilewright.autotune.pool`); for a fleet, :mod:`tilewright.autotune.warm_ray`
runs one Ray task per problem and merges the results into the same cache.

A dynamic problem (``problem.dynamic``) is expanded to every bucket up to its size or
``max_m`` (see :mod:`tilewright.autotune.buckets`), so a server never tunes on a request.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from tilewright._config import config
from tilewright.autotune.cache import ProblemKey, TuningCache, default_cache
from tilewright.autotune.files import check_replaceable, json_object
from tilewright.autotune.pool import pool_scope
from tilewright.autotune.select import leaves_no_record, local_devices, select_gemm
from tilewright.autotune.shapes import NamedProblem
from tilewright.errors import TilewrightError
from tilewright.kinds import kind_of
from tilewright.runtime.targets import Target

log = logging.getLogger("tilewright.autotune")


class WarmError(TilewrightError):
    """The warmer cannot run as asked; the message says what to change."""


def expand_buckets(problems: Iterable[NamedProblem], max_m: int | None = None) -> list[NamedProblem]:
    """Dynamic problems become one problem per bucket, as their kind says
    (:meth:`~tilewright.kinds.ProblemKind.bucket_variants`: a GEMM's M up to ``max_m`` or its
    own size; loop kernels and grouped GEMMs come at their bucket already)."""
    out: list[NamedProblem] = []
    for item in problems:
        for suffix, p in kind_of(item.problem).bucket_variants(item.problem, max_m):
            out.append(NamedProblem(item.name + suffix, p) if suffix or p is not item.problem else item)
    seen: set = set()
    return [p for p in out if not (p.problem in seen or seen.add(p.problem))]  # type: ignore[func-returns-value]


def plan_digest(problems: Sequence[NamedProblem], target: str) -> str:
    """Identity of a plan: the target and every problem, in order."""
    blob = json.dumps([target] + [p.problem.to_json() for p in problems], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class WarmState:
    """Which problems of a plan are finished (name -> winner) or failed (name -> reason).

    Saved atomically after every problem, so a killed warmer loses at most the problem it was
    tuning (and not even that problem's finished candidates, which are in the cache).
    """

    path: Path
    plan: str
    done: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def is_state(raw: bytes) -> bool:
        """Whether bytes are a warm progress file (what :meth:`save` may replace)."""
        data = json_object(raw)
        return data is not None and isinstance(data.get("plan"), str) and isinstance(data.get("done"), dict)

    @staticmethod
    def load(path: Path, plan: str) -> "WarmState":
        """The progress recorded at ``path`` for ``plan`` (empty for another plan or no file).

        Raises:
            OutputFileError: ``path`` holds something else (a README, a bundle, a folder): it
                would be overwritten by the first save.
        """
        check_replaceable(path, WarmState.is_state, "a warm progress file")
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            return WarmState(path, plan)
        if data.get("plan") != plan:
            return WarmState(path, plan)  # another plan: start afresh
        return WarmState(path, plan, dict(data.get("done", {})), dict(data.get("failed", {})))

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"plan": self.plan, "done": self.done, "failed": self.failed},
                                  indent=1, sort_keys=True))
        os.replace(tmp, self.path)


REPORT_FORMAT = "tilewright-warm-report/1"


@dataclass
class WarmReport:
    """What one warmer run did. ``measured``: candidate records benchmarked in this run."""

    total: int
    skipped: int = 0
    tuned: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    measured: int = 0
    seconds: float = 0.0
    state_path: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"format": REPORT_FORMAT, **self.__dict__}

    @staticmethod
    def is_report(raw: bytes) -> bool:
        """Whether bytes are a warm report (what ``warm --json`` may replace)."""
        data = json_object(raw)
        return data is not None and (data.get("format") == REPORT_FORMAT
                                     or {"total", "tuned", "skipped"} <= set(data))


def default_state_path(cache: TuningCache, plan: str) -> Path:
    return cache.path.parent / "warm" / f"{plan}.json"


def warm(problems: Sequence[NamedProblem], target: Target, factory: Any, *,
         cache: TuningCache | None = None, state_path: Path | None = None, restart: bool = False,
         use_ray: bool = False, ray_address: str | None = None,
         on_progress: Callable[[str, str], None] | None = None) -> WarmReport:
    """Tune every problem for ``target`` into ``cache``, skipping those already finished.

    Args:
        problems: what to tune (dynamic ones already expanded, see :func:`expand_buckets`).
        target: must be this machine's (or, with Ray, the workers').
        factory: the kernel factory (picklable).
        cache: where results go (default: the cache under ``config.cache_dir``).
        state_path: the resumable state (default: ``<cache folder>/warm/<plan>.json``).
        restart: ignore the progress file and go through every problem again; records the
            cache still holds answer without measuring (prune them to measure again).
        use_ray, ray_address: run one Ray task per problem (see :mod:`~.warm_ray`).
        on_progress: called as ``on_progress(name, status)`` after each problem.

    Raises:
        WarmError: the target cannot be measured here and Ray is not used.
    """
    t0 = time.perf_counter()
    cache = cache if cache is not None else default_cache()
    plan = plan_digest(problems, target.name)
    state = WarmState(state_path or default_state_path(cache, plan), plan)
    check_replaceable(state.path, WarmState.is_state, "a warm progress file")  # --restart too
    if not restart:
        state = WarmState.load(state.path, plan)
    report = WarmReport(total=len(problems), state_path=str(state.path))
    # the progress file only says what was finished; the cache says what is still there (a
    # pruned, deleted or quarantined cache, or another cache file, means tuning again)
    todo = [p for p in problems if p.name not in state.done or not _in_cache(p.problem, target, cache)]
    report.skipped = len(problems) - len(todo)
    if not use_ray and not local_devices(target):
        raise WarmError(f"target {target.name} is not on this machine, so nothing can be measured "
                        f"here; run the warmer where the target is, or on a fleet with --ray")

    def finish(name: str, winner: str | None, measured: int, error: str | None) -> None:
        if error is None:
            state.done[name] = winner or ""
            state.failed.pop(name, None)
            report.tuned += 1
        else:
            state.failed[name] = error
            report.failed[name] = error
        report.measured += measured
        state.save()
        if on_progress is not None:
            on_progress(name, "failed" if error else "done")

    if use_ray:
        from tilewright.autotune.warm_ray import warm_on_ray

        warm_on_ray(todo, target, factory, cache, finish, address=ray_address)
    else:
        with pool_scope():
            for item in todo:
                try:
                    sel = select_gemm(item.problem, target, factory, cache=cache)
                except TilewrightError as e:
                    finish(item.name, None, 0, f"{type(e).__name__}: {e}")
                    continue
                finish(item.name, sel.winner.name, sum(not r.from_cache for r in sel.results), None)
    report.seconds = time.perf_counter() - t0
    return report


def _in_cache(problem: Any, target: Target, cache: TuningCache) -> bool:
    """Whether the cache holds what tuning ``problem`` leaves behind (a loop kernel with only
    its untimed torch form leaves nothing and needs nothing)."""
    return bool(cache.lookup(ProblemKey.for_problem(problem, target.name))) or leaves_no_record(problem, target)


def settings_for_workers() -> dict[str, Any]:
    """The settings a remote worker should tune with (this process's, less its paths)."""
    return {k: v for k, v in config.as_dict().items() if k not in ("cache_dir", "debug_dir")}
