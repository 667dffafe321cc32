"""Isolated tuning: candidates compile and run in worker processes, one per local device.

A candidate that crashes its process (segfault, abort, illegal memory access), hangs (ptxas,
an endless kernel) or runs out of memory disqualifies itself only: its record says why, the
worker is replaced, and tuning goes on with the next candidate. Workers are started with
``spawn`` (never ``fork``: CUDA and threads do not survive it), rebuild each candidate from its
template id and parameters through the factory they were handed, and exit when the pool closes,
when their parent dies, or after an error that leaves their device state suspect (CUDA error,
OOM).

Timeouts per candidate have two phases. *Compile* (build plus the first, JIT-compiling run) gets
``max(config.compile_timeout_s, config.compile_timeout_factor x median of the compile times
observed so far)``: generous until the pool knows how long compiles take here, then tight enough
that a hung ptxas does not cost minutes per candidate. *Run* (check and timing) gets
``config.bench_timeout_s``. Starting a worker gets ``start_timeout_s``; a worker that cannot start
raises :class:`~tilewright.errors.TuningWorkerError` (that is the environment, not a candidate).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from tilewright._config import config
from tilewright.autotune.cache import Record
from tilewright.autotune.evaluate import EvalOutcome, EvalTask
from tilewright.errors import TuningWorkerError

log = logging.getLogger("tilewright.autotune")


class CompileTimeouts:
    """The adaptive compile timeout: max(floor, factor x median of recent compile times), s.

    Floor and factor default to ``config.compile_timeout_s`` and
    ``config.compile_timeout_factor``, read when the timeout is asked for.
    """

    def __init__(self, floor_s: float | None = None, factor: float | None = None,
                 window: int = 64):
        self._floor, self._factor = floor_s, factor
        self._seen: deque[float] = deque(maxlen=window)

    def observe(self, seconds: float) -> None:
        """Record how long one successful compile (build + first run) took, s."""
        self._seen.append(seconds)

    @property
    def seconds(self) -> float:
        floor = config.compile_timeout_s if self._floor is None else self._floor
        factor = config.compile_timeout_factor if self._factor is None else self._factor
        if not self._seen:
            return floor
        return max(floor, factor * statistics.median(self._seen))

    def describe(self) -> str:
        med = f"{statistics.median(self._seen):.2f} s" if self._seen else "none yet"
        return f"{self.seconds:.1f} s (adaptive; median compile {med})"


# -- the worker side ---------------------------------------------------------------------------
def _watch_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)  # orphaned: the tuner died, nobody will read our results
        time.sleep(0.5)


def _worker_main(conn: mpc.Connection, device: str, parent_pid: int, registrations: list) -> None:
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    from tilewright.autotune.evaluate import evaluate
    from tilewright.templates import replay

    replay(registrations)  # languages and templates the parent registered from user code

    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(torch.device(device))
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        task, settings, factory = msg
        for name, value in settings.items():
            setattr(config, name, value)
        try:
            out = evaluate(task, factory, on_compiled=lambda s: conn.send(("compiled", s)))
        except Exception as e:  # noqa: BLE001 - a bug here must not look like a crash
            c = task.candidate
            out = EvalOutcome(Record(c.template_id, c.template_hash, c.param_dict, "failed",
                                     reason=f"worker: {type(e).__name__}: {e}"[:500]), fatal=True)
        conn.send(("result", out.record.to_json(), out.compile_s, out.fatal, out.transient))
        if out.fatal:
            return  # device state is suspect: the pool starts a fresh worker


# -- the parent side ---------------------------------------------------------------------------
@dataclass
class _Job:
    index: int
    task: EvalTask
    phase: str  # "starting", "compiling", "running"
    deadline: float
    limit_s: float


class _Worker:
    def __init__(self, ctx: Any, device: str):
        self.device = device
        parent, child = ctx.Pipe()
        from tilewright.templates import registered_by_calls

        self.proc = ctx.Process(target=_worker_main, args=(child, device, os.getpid(), registered_by_calls()),
                                daemon=True, name=f"tilewright-tuner-{device}")
        self.proc.start()
        child.close()
        self.conn = parent
        self.ready = False
        self.job: _Job | None = None

    def exit_text(self) -> str:
        self.proc.join(5)
        code = self.proc.exitcode
        if code is None:
            return "stopped answering"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code}"

    def stop(self, polite: bool = True) -> None:
        if polite and self.proc.is_alive():
            with contextlib.suppress(OSError, ValueError):
                self.conn.send(None)
            self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class WorkerPool:
    """Worker processes, one per device string in ``devices`` ("cuda:0", "cuda:1" or "cpu").

    Use as a context manager (or call :meth:`close`): no worker outlives the pool. Workers start
    when first needed and serve any number of problems and factories.

    Args:
        devices: one worker per entry.
        start_timeout_s: most seconds a worker may take to start (imports, device init).

    Raises:
        ValueError: no devices.
    """

    def __init__(self, devices: Sequence[str], start_timeout_s: float = 300.0):
        if not devices:
            raise ValueError("WorkerPool needs at least one device")
        self.devices = list(devices)
        self.start_timeout_s = start_timeout_s
        self.timeouts = CompileTimeouts()
        self.pids: list[int] = []
        self._ctx = mp.get_context("spawn")
        self._slots: list[_Worker | None] = [None] * len(self.devices)
        self._lock = threading.Lock()  # one evaluate() at a time: workers serve one task each

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker (politely, then by SIGKILL) and reap it."""
        for i, w in enumerate(self._slots):
            if w is not None:
                w.stop()
                self._slots[i] = None

    def _worker(self, slot: int) -> _Worker:
        w = self._slots[slot]
        if w is None or not w.proc.is_alive():
            if w is not None:
                w.stop(polite=False)
            w = self._slots[slot] = _Worker(self._ctx, self.devices[slot])
            self.pids.append(w.proc.pid)
        return w

    def _retire(self, slot: int) -> None:
        w = self._slots[slot]
        if w is not None:
            w.stop(polite=False)
            self._slots[slot] = None

    def evaluate(self, tasks: Sequence[EvalTask], factory: Any,
                 on_result: Callable[[EvalTask, EvalOutcome], None] | None = None
                 ) -> list[EvalOutcome]:
        """Evaluate every task in the workers (spread over the devices); results in task order.

        ``factory`` (a picklable kernel factory) is sent along and rebuilds each candidate in
        the worker. ``best_ms`` of each task is replaced by the best median seen so far when it
        is sent.

        Raises:
            TuningWorkerError: a worker could not start.
        """
        with self._lock:
            return self._evaluate(tasks, factory, on_result)

    def _evaluate(self, tasks: Sequence[EvalTask], factory: Any,
                  on_result: Callable[[EvalTask, EvalOutcome], None] | None) -> list[EvalOutcome]:
        settings = config.as_dict()
        results: list[EvalOutcome | None] = [None] * len(tasks)
        pending = deque(range(len(tasks)))
        best = min((t.best_ms for t in tasks if t.best_ms is not None), default=None)
        while pending or any(w is not None and w.job for w in self._slots):
            now = time.monotonic()
            for slot in range(len(self._slots)):
                w = self._slots[slot]
                if pending and (w is None or w.job is None):
                    w = self._worker(slot)
                    i = pending.popleft()
                    task = dataclasses.replace(tasks[i], device=w.device, best_ms=best)
                    w.conn.send((task, settings, factory))
                    limit = self.timeouts.seconds if w.ready else self.start_timeout_s
                    w.job = _Job(i, task, "compiling" if w.ready else "starting", now + limit, limit)
            busy = [(s, w) for s, w in enumerate(self._slots) if w is not None and w.job]
            wait_s = max(0.0, min(w.job.deadline for _, w in busy) - time.monotonic())
            ready = mpc.wait([w.conn for _, w in busy], timeout=wait_s)
            for slot, w in busy:
                job = w.job
                assert job is not None
                if w.conn in ready:
                    done = self._receive(slot, w, job, results)
                elif time.monotonic() >= job.deadline:
                    done = self._timed_out(slot, job, results)
                else:
                    continue
                if done is not None:
                    out = results[job.index]
                    assert out is not None
                    rec = out.record
                    if rec.status == "ok" and rec.median_ms is not None:
                        best = rec.median_ms if best is None else min(best, rec.median_ms)
                    if rec.status == "failed":
                        log.warning("candidate %s for %s disqualified: %s", job.task.candidate.name,
                                    job.task.problem.describe(), rec.reason)
                    if on_result is not None:
                        on_result(job.task, out)
        return [r for r in results if r is not None]

    def _failed(self, job: _Job, reason: str) -> EvalOutcome:
        c = job.task.candidate
        return EvalOutcome(Record(c.template_id, c.template_hash, c.param_dict, "failed",
                                  reason=reason[:500], rank=c.rank, predicted_ms=c.predicted_ms))

    def _receive(self, slot: int, w: _Worker, job: _Job, results: list) -> bool | None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            how = w.exit_text()
            self._retire(slot)
            if job.phase == "starting":
                raise TuningWorkerError(
                    f"a tuning worker for {w.device} {how} before it was ready; run with "
                    f"TILEWRIGHT_ISOLATE=off to see the error in-process") from None
            results[job.index] = self._failed(job, f"crash: worker {how} while {job.phase}")
            w.job = None
            return True
        kind = msg[0]
        now = time.monotonic()
        if kind == "ready":
            w.ready = True
            limit = self.timeouts.seconds
            job.phase, job.deadline, job.limit_s = "compiling", now + limit, limit
            return None
        if kind == "compiled":
            self.timeouts.observe(msg[1])
            limit = config.bench_timeout_s
            job.phase, job.deadline, job.limit_s = "running", now + limit, limit
            return None
        _, record, compile_s, fatal, transient = msg
        results[job.index] = EvalOutcome(Record.from_json(record), compile_s, fatal, transient)
        w.job = None
        if fatal:
            self._retire(slot)
        return True

    def _timed_out(self, slot: int, job: _Job, results: list) -> bool:
        w = self._slots[slot]
        self._retire(slot)
        if job.phase == "starting":
            raise TuningWorkerError(
                f"a tuning worker for {w.device if w else '?'} did not start within "
                f"{self.start_timeout_s:.0f} s; check that torch imports and the device "
                f"initialises, or run with TILEWRIGHT_ISOLATE=off")
        what = ("compile (build + first run)" if job.phase == "compiling" else "check and timing")
        extra = f", adaptive: {self.timeouts.describe()}" if job.phase == "compiling" else ""
        results[job.index] = self._failed(
            job, f"timeout: {what} took over {job.limit_s:.1f} s{extra}; worker killed")
        return True


# -- sharing one pool across selections ---------------------------------------------------------
_scopes: list[dict[tuple, WorkerPool]] = []
_scope_lock = threading.Lock()


@contextlib.contextmanager
def pool_scope() -> Iterator[None]:
    """Inside the block, isolated selections share worker pools (started when first needed);
    all are closed when the block ends, so nothing is left running."""
    pools: dict[tuple, WorkerPool] = {}
    with _scope_lock:
        _scopes.append(pools)
    try:
        yield
    finally:
        with _scope_lock:
            _scopes.remove(pools)
        for p in pools.values():
            p.close()


@contextlib.contextmanager
def acquire_pool(devices: Sequence[str]) -> Iterator[WorkerPool]:
    """The pool of the innermost :func:`pool_scope` for these devices, or a pool of its own
    that is closed when the block ends."""
    with _scope_lock:
        scope = _scopes[-1] if _scopes else None
    if scope is None:
        with WorkerPool(devices) as pool:
            yield pool
        return
    key = tuple(devices)
    if key not in scope:
        scope[key] = WorkerPool(devices)
    yield scope[key]
