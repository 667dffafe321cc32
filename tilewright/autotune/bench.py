"""Timing one kernel: device events on GPUs, ``time.perf_counter`` on the CPU.

Each run is timed on its own; the result is the median and a spread (half the interquartile
range), in ms. Three things keep the number honest:

* on a GPU the L2 cache is flushed before every timed run, so a kernel is not flattered by data
  the previous run left behind;
* the work may be given as several callables over different input sets, which are cycled
  (*input rotation*), so a kernel does not meet the same operands in cache run after run;
* the number of runs adapts: at least ``min_rep`` timed runs, then timing stops as soon as the
  spread is within ``stable_pct`` percent of the median (a stable estimate), or at ``rep`` runs,
  or when ``budget_ms`` of timed runs is spent, whichever comes first.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

_L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any L2 in the target registry
_flush_buffers: dict[str, torch.Tensor] = {}


@dataclass(frozen=True)
class Timing:
    """Median and spread of timed runs, ms; ``aborted`` when timing stopped early because the
    candidate could not win."""

    median_ms: float
    spread_ms: float
    reps: int
    aborted: bool = False

    @property
    def rel_spread(self) -> float:
        """Spread as a fraction of the median (0 when the median is 0)."""
        return self.spread_ms / self.median_ms if self.median_ms > 0 else 0.0

    def as_dict(self) -> dict:
        return {"median_ms": self.median_ms, "spread_ms": self.spread_ms, "reps": self.reps,
                "aborted": self.aborted}


def _flush_l2(device: torch.device) -> None:
    key = str(device)
    buf = _flush_buffers.get(key)
    if buf is None:
        buf = _flush_buffers[key] = torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    buf.zero_()


def summarise(times: Sequence[float], aborted: bool = False) -> Timing:
    """Median and spread (half the interquartile range; half the range below 4 samples), ms.

    Raises:
        ValueError: ``times`` is empty.
    """
    if not times:
        raise ValueError("summarise needs at least one time")
    if len(times) >= 4:
        q = statistics.quantiles(times, n=4)
        spread = (q[2] - q[0]) / 2
    elif len(times) >= 2:
        spread = (max(times) - min(times)) / 2
    else:
        spread = 0.0
    return Timing(statistics.median(times), spread, len(times), aborted)


def _time_once(fn: Callable[[], object], gpu: bool, device: torch.device) -> float:
    if gpu:
        _flush_l2(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def time_callable(fn: Callable[[], object] | Sequence[Callable[[], object]], device: torch.device,
                  *, warmup: int, rep: int, budget_ms: float, abort_above_ms: float | None = None,
                  min_rep: int = 1, stable_pct: float = 0.0) -> Timing:
    """Time ``fn()`` on ``device``.

    Args:
        fn: the work to time (already compiled; its first call should not compile), or several
            callables over different input sets, cycled run after run (input rotation).
        device: where it runs; CUDA/ROCm devices use events (with an L2 flush before each timed
            run), others the wall clock.
        warmup: untimed runs first (each input set at least once when there are several).
        rep: most timed runs.
        budget_ms: stop once this much time has been spent on timed runs (at least one timed run
            always happens).
        abort_above_ms: stop after the first timed run if it took longer than this (the
            candidate cannot win); the result is then marked ``aborted``.
        min_rep: timed runs before the stability rule may stop timing.
        stable_pct: stop once the spread is at most this percentage of the median (0: never
            stop early for stability).

    Returns:
        :class:`Timing` with median and spread in ms.
    """
    fns = list(fn) if isinstance(fn, Sequence) else [fn]
    if not fns:
        raise ValueError("time_callable needs at least one callable")
    for i in range(max(warmup, len(fns) if warmup else 0)):
        fns[i % len(fns)]()
    gpu = device.type == "cuda"
    times: list[float] = []
    spent = 0.0
    for i in range(max(rep, 1)):
        ms = _time_once(fns[i % len(fns)], gpu, device)
        times.append(ms)
        spent += ms
        if abort_above_ms is not None and len(times) == 1 and ms > abort_above_ms:
            return summarise(times, aborted=True)
        if spent >= budget_ms:
            break
        if stable_pct > 0 and len(times) >= max(min_rep, 2):
            t = summarise(times)
            if t.spread_ms <= t.median_ms * stable_pct / 100:
                break
    return summarise(times)
