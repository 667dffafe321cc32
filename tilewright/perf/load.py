"""How busy the machine was while a CPU suite timed a case, and what that does to the gate.

With one torch thread the CPU suites time each call by the CPU time of its thread
(:func:`tilewright.perf.cpu_suite.thread_ms`), which other jobs barely add to, and ``bench
compare`` gates tilewright's time over eager's, timed side by side, so a uniform slowdown
cancels. What does not cancel on a shared host is that other jobs change *how* the code runs:
they evict the shared caches, take memory bandwidth and preempt the timed thread (each
preemption refills its caches on its own clock), and a fused kernel and eager's chain of ops
suffer differently. Measured on this project's 2-core machine with 7 other sessions' jobs on it:
an unchanged clone's ratios moved by up to +36% against a baseline recorded on a quiet machine
(rms_norm +35.7%, llama_bf16 +14.1%) while each run's own standard error said 1-2%; the
standard error measures the noise *within* a run, not that between a quiet run and a busy one.

So each timed case records how much of the wall time its thread was running
(:class:`LoadProbe`: ``running_share`` = thread CPU time / wall time over the timing rounds;
about 1 when the thread has a core to itself, 1/3 when it shares one with two other jobs) and
the 1-minute load average per CPU. A row is *busy* when its thread ran less than
:data:`BUSY_RUNNING_SHARE` of the time or the load average exceeded :data:`BUSY_LOAD` per CPU;
``bench compare`` then weighs a change against :data:`BUSY_NOISE` as well as the standard
error: a change within it is ``noisy`` (reported, not failed), a larger one still fails. Two
quiet runs are judged on their standard errors alone, so a 10% regression fails there.
"""

from __future__ import annotations

import os
import time
from typing import Any

# the timed thread ran less than this share of the wall time: other jobs held the cores
BUSY_RUNNING_SHARE = 0.85
# 1-minute load average per CPU above which a run is busy even when its thread was lucky
BUSY_LOAD = 1.0
# the largest change of an unchanged clone's ratio measured between a quiet and a busy run,
# rounded up (+35.7% measured, bench/gate_noise.py and the runs): within it, a busy
# comparison cannot tell a regression from the load
BUSY_NOISE = 0.40


def load_per_cpu() -> float | None:
    """The 1-minute load average divided by the CPUs (None where the OS has none)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return None


class LoadProbe:
    """``with LoadProbe() as p:`` around the timed rounds; afterwards ``p.summary()`` is the
    row's ``load`` record: ``running_share`` (thread CPU s / wall s of the block, 0-1),
    ``load_per_cpu`` (the larger of the block's start and end 1-minute load averages per CPU)
    and ``busy`` (see the module docstring). Only meaningful where one thread does the work
    (``cpu_threads`` 1): a thread pool's work runs on threads this does not see."""

    def __enter__(self) -> "LoadProbe":
        self._load0 = load_per_cpu()
        self._wall0, self._cpu0 = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall_s = time.perf_counter() - self._wall0
        self.cpu_s = time.thread_time() - self._cpu0
        loads = [x for x in (self._load0, load_per_cpu()) if x is not None]
        self.load = max(loads) if loads else None

    def summary(self) -> dict[str, Any]:
        share = min(1.0, self.cpu_s / self.wall_s) if self.wall_s > 0 else 1.0
        return {"running_share": round(share, 3),
                "load_per_cpu": None if self.load is None else round(self.load, 2),
                "busy": is_busy(share, self.load)}


def is_busy(running_share: float | None, load: float | None) -> bool:
    """Whether a row timed with this running share and load per CPU was on a busy machine."""
    return bool((running_share is not None and running_share < BUSY_RUNNING_SHARE)
                or (load is not None and load > BUSY_LOAD))


def row_busy(row: dict[str, Any]) -> bool | None:
    """A results row's ``load.busy``; None for a row recorded before loads were (old files)."""
    load = row.get("load")
    return None if not isinstance(load, dict) else bool(load.get("busy"))
