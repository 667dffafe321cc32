"""Timing one callable: device events on GPUs, ``time.perf_counter`` on the CPU.

Each run is timed on its own; the result is the median and a spread (half the interquartile
range), in ms. On a GPU the L2 cache is flushed before every timed run so a kernel is not
flattered by data the previous run left behind.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

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

    def as_dict(self) -> dict:
        return {"median_ms": self.median_ms, "spread_ms": self.spread_ms, "reps": self.reps,
                "aborted": self.aborted}


def _flush_l2(device: torch.device) -> None:
    key = str(device)
    buf = _flush_buffers.get(key)
    if buf is None:
        buf = _flush_buffers[key] = torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    buf.zero_()


def _summarise(times: list[float], aborted: bool = False) -> Timing:
    if len(times) >= 4:
        q = statistics.quantiles(times, n=4)
        spread = (q[2] - q[0]) / 2
    elif len(times) >= 2:
        spread = (max(times) - min(times)) / 2
    else:
        spread = 0.0
    return Timing(statistics.median(times), spread, len(times), aborted)


def time_callable(fn: Callable[[], object], device: torch.device, *, warmup: int, rep: int,
                  budget_ms: float, abort_above_ms: float | None = None) -> Timing:
    """Time ``fn()`` on ``device``.

    Args:
        fn: the work to time (already compiled; its first call should not compile).
        device: where it runs; CUDA/ROCm devices use events, others the wall clock.
        warmup: untimed runs first.
        rep: most timed runs.
        budget_ms: stop timing once this much time has been spent on timed runs (at least one
            timed run always happens).
        abort_above_ms: stop after the first timed run if it took longer than this (the
            candidate cannot win); the result is then marked ``aborted``.
    """
    for _ in range(warmup):
        fn()
    gpu = device.type == "cuda"
    times: list[float] = []
    spent = 0.0
    for _ in range(max(rep, 1)):
        if gpu:
            _flush_l2(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1e3
        times.append(ms)
        spent += ms
        if abort_above_ms is not None and len(times) == 1 and ms > abort_above_ms:
            return _summarise(times, aborted=True)
        if spent >= budget_ms:
            break
    return _summarise(times)
