"""``tilewright bench run``: time tilewright's choice against ATen (and Inductor max-autotune)
for every problem of a suite, on this machine.

Per problem: the autotuner chooses (using and filling the tuning cache), then the chosen kernel,
ATen and optionally Inductor are each checked against the float64 reference and timed with the
same benchmarker, on the same rotated input sets, *side by side*: one run of each per round,
alternating which goes first (:func:`time_side_by_side`). Each is recorded with its median time
and spread (ms), TFLOP/s (2·M·N·K·batch per time) and GB/s (minimum bytes moved per time), and
the problem with ``paired_vs_aten``: tilewright's time over ATen's round by round, summarised
(:func:`paired_ratio`). A busy machine slows both alike within a round, so that ratio keeps
steady where the times themselves drift; it is what ``bench compare`` gates on by default. The
results file also records the target, arch, device name and the torch/triton/tilewright/CUDA
versions and the wrapper's own cost per kernel call (``launch_overhead_us``, µs, measured with a
null kernel: :mod:`tilewright.perf.launch`), and is rewritten after every problem, so a run cut
short still leaves its results.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from tilewright._config import config
from tilewright.autotune.bench import summarise, time_callable
from tilewright.autotune.cache import current_versions
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.evaluate import input_set_count
from tilewright.kinds.gemm.checks import make_inputs, poisoned_output, rel_error
from tilewright.autotune.pool import pool_scope
from tilewright.autotune.select import local_devices, select_gemm
from tilewright.autotune.shapes import NamedProblem
from tilewright.errors import TilewrightError
from tilewright.perf.launch import launch_overhead
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.runtime.targets import Target

FORMAT = "tilewright-bench/1"


def environment(target: Target, device: torch.device) -> dict[str, Any]:
    """Where the numbers come from: target, arch, device name and software versions."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
    versions = current_versions() | {"cuda": torch.version.cuda or "",
                                     "hip": getattr(torch.version, "hip", None) or "",
                                     "python": platform.python_version()}
    return {"target": target.name, "arch": target.arch, "device": name, "versions": versions}


def _inductor_fn(problem: GemmProblem) -> Callable:
    if problem.block_scaled:
        raise TilewrightError("Inductor has no NVFP4/MX GEMM to compare with (ATen's row is the dequantised matmul)")
    if problem.epilogue:
        raise TilewrightError("Inductor comparison covers plain GEMMs only")
    fn = torch.bmm if problem.batched else torch.mm
    return torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)


# the ratio's standard error is ~1.86 x the per-pair spread / sqrt(pairs): 20 pairs put it at
# ~0.4x that spread, inside the gate's floor. Fewer would leave the gate blind (a "noisy" row
# passes), so the time budget does not cut a problem short of them.
PAIRS_MIN = 20
# past bench_rep rounds, timing goes on (to 10x as many, within the time budget) while the
# tilewright/ATen ratio's standard error is above 1%: 3 x hypot(1%, 1%) = 4.2% stays under the
# gate's 5% floor, so a burst of interference in one run does not leave the gate blind
RATIO_STDERR = 0.01
EXTRA_ROUNDS = 10
# on a CPU, torch's thread pool waits for workers the OS has descheduled: on a shared 2-core
# machine (this project's) a microsecond GEMM then takes 20-50 ms on a third of its calls (the
# scheduler's latency, not the kernel); one thread times the kernel
CPU_THREADS = 1


def _prepare(problem: GemmProblem, launch: Callable, device: torch.device, reference: Callable,
             target: str, seed: int = 0) -> tuple[list[Callable[[], object]], float]:
    """The calls to time (one per rotated input set, each with its own output) and the relative
    error of the first against the reference."""
    sets = [make_inputs(problem, device, seed + i) for i in range(input_set_count(problem, target))]
    outs = [poisoned_output(problem, device) for _ in sets]
    # block-scaled operands carry their scales (GemmInputs.scale_kwargs; empty otherwise); the
    # rotated sets give each timed run other weights and scales, so a decode GEMM reads them
    # cold (with the L2 flush before each run)
    runs = [lambda x=x, o=o: launch(x.a, x.b, *x.epilogue_inputs, out=o, **x.scale_kwargs)
            for x, o in zip(sets, outs)]
    return runs, rel_error(runs[0](), reference(sets[0]))


def _timed_once(fn: Callable[[], object], device: torch.device) -> float:
    """One timed run, ms, by the benchmarker's rules (events and an L2 flush on GPUs)."""
    return time_callable(fn, device, warmup=0, rep=1, budget_ms=0.0).median_ms


def _stable(times: list[float]) -> bool:
    t = summarise(times)
    return t.spread_ms <= t.median_ms * config.bench_stable_pct / 100


def time_side_by_side(runs: dict[str, list[Callable[[], object]]], device: torch.device,
                      pair: tuple[str, str] = ("tilewright", "aten"),
                      clock: Callable[[Callable[[], object]], float] | None = None
                      ) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Time implementations interleaved: each round times one run of each, the order reversed
    every other round (ABBA), so a machine that slows down or speeds up mid-run (another job,
    clocks, thermals) touches all of them alike and their ratio cancels it; each cycles its own
    input sets.

    Rounds: at least ``max(bench_min_rep, PAIRS_MIN)``; past that, none once
    ``bench_budget_ms`` per implementation is spent or every implementation's spread is
    within ``bench_stable_pct`` of its median; at most ``max(bench_rep, PAIRS_MIN)``, or up to
    ``EXTRA_ROUNDS`` times that while the ``pair``'s ratio (:func:`paired_ratio`) has a
    standard error above ``RATIO_STDERR`` of it.

    ``clock(fn) -> ms`` times one run (default: the benchmarker's, :func:`_timed_once`).

    Returns:
        per implementation its times (ms), index ``i`` of each from round ``i``; and per
        implementation dropped mid-way, the error it raised (its times are then discarded).
    """
    timed = clock or (lambda fn: _timed_once(fn, device))
    live = list(runs)
    for name in live:  # warm-up: each input set at least once, as the benchmarker does
        for i in range(max(config.bench_warmup, len(runs[name]) if config.bench_warmup else 0)):
            runs[name][i % len(runs[name])]()
    times: dict[str, list[float]] = {name: [] for name in live}
    errors: dict[str, str] = {}
    budget = max(config.bench_budget_ms, 50.0) * len(live)
    least = max(config.bench_min_rep, PAIRS_MIN)
    most = max(config.bench_rep, least)
    spent = 0.0
    for r in range(most * EXTRA_ROUNDS):
        for name in (live if r % 2 == 0 else live[::-1]):
            try:
                ms = timed(runs[name][r % len(runs[name])])
            except Exception as e:  # noqa: BLE001 - one implementation failing is a result
                errors[name] = f"{type(e).__name__}: {e}"[:300]
                continue
            times[name].append(ms)
            spent += ms
        for name in errors:  # keep the rest paired round by round
            if name in live:
                live.remove(name)
                times.pop(name)
        done = r + 1
        if not live or (done >= least and spent >= budget):
            break
        if done >= least and all(_stable(times[name]) for name in live):
            break
        # past `most`, only an imprecise ratio keeps timing (checked every PAIRS_MIN rounds)
        if done >= most and (done - most) % PAIRS_MIN == 0 and _ratio_precise(times, pair):
            break
    return times, errors


def _ratio_precise(times: dict[str, list[float]], pair: tuple[str, str]) -> bool:
    """Whether ``pair``'s paired ratio is known to ``RATIO_STDERR`` (True without the pair)."""
    if not all(name in times for name in pair):
        return True
    r = paired_ratio(times[pair[0]], times[pair[1]])
    return r["stderr"] <= RATIO_STDERR * r["ratio"]


def timing_summary(problem: GemmProblem, times: list[float]) -> dict[str, Any]:
    """``{ms, spread_ms, reps, tflops, gbps}`` of one implementation's times (ms; TFLOP/s; GB/s)."""
    t = summarise(times)
    return {"ms": t.median_ms, "spread_ms": t.spread_ms, "reps": t.reps,
            "tflops": problem.flops / (t.median_ms * 1e9) if t.median_ms > 0 else None,
            "gbps": problem.min_bytes / (t.median_ms * 1e6) if t.median_ms > 0 else None}


def paired_ratio(mine: Sequence[float], theirs: Sequence[float]) -> dict[str, float | int]:
    """``mine / theirs`` run by run (both in ms, timed side by side), summarised.

    Returns ``{ratio, spread, stderr, pairs}``: the median of the per-round ratios, their
    spread (half the interquartile range) and the standard error of that median
    (``1.858 x spread / sqrt(pairs)``: 1.2533 sigma/sqrt(n) for a median, sigma = spread / 0.6745),
    the figure ``bench compare`` weighs a change of the ratio against.

    Raises:
        ValueError: no pairs, or a time that is not positive.
    """
    if not mine or len(mine) != len(theirs):
        raise ValueError(f"paired_ratio needs pairs of times (got {len(mine)} and {len(theirs)})")
    if min(min(mine), min(theirs)) <= 0:
        raise ValueError("paired_ratio needs positive times (ms)")
    t = summarise([a / b for a, b in zip(mine, theirs)])
    return {"ratio": t.median_ms, "spread": t.spread_ms,
            "stderr": 1.858 * t.spread_ms / math.sqrt(t.reps), "pairs": t.reps}


def check_slowdown(fraction: float, device: torch.device) -> None:
    """Refuse an injected slowdown this harness cannot make real.

    Raises:
        TilewrightError: ``fraction`` is negative, or ``device`` is not the CPU (a GPU launch
            returns before the kernel ends, so a wait after the call would not be timed as the
            kernel's).
    """
    if fraction < 0:
        raise TilewrightError(f"an injected slowdown cannot be negative ({fraction:+.0%})")
    if fraction and device.type != "cpu":
        raise TilewrightError(f"--inject-slowdown is a CPU-timer test hook; {device} is timed "
                              "with device events, which a host-side wait does not slow")


def slowed(runs: Sequence[Callable[[], object]], fraction: float, device: torch.device
           ) -> list[Callable[[], object]]:
    """``runs``, each made ``fraction`` slower for real: after each call it busy-waits for
    ``fraction`` of the time that call took, less what the wrapper's own clock reads cost, as a
    kernel doing that much more work would take at the machine's speed of the moment. A test
    hook (``bench run --inject-slowdown``) showing the gate catches a slowdown of the thing it
    measures, not of numbers edited in a file.

    Raises:
        TilewrightError: see :func:`check_slowdown`.
    """
    check_slowdown(fraction, device)
    cost_s = _wrapper_cost_s()
    return [_slow(run, fraction, cost_s) for run in runs]


def _slow(run: Callable[[], object], fraction: float, cost_s: float) -> Callable[[], object]:
    clock = time.perf_counter

    def slow() -> object:
        t0 = clock()
        out = run()
        t1 = clock()
        until = t1 + (t1 - t0) * fraction - cost_s
        while clock() < until:  # busy: a sleep overshoots microsecond calls
            pass
        return out

    return slow


def _wrapper_cost_s(calls: int = 2000, repeats: int = 5) -> float:
    """What :func:`_slow`'s clock reads add to a call (s): a wrapped no-op less a bare one,
    best of ``repeats``. Without it a 10% injection reads as ~15% on a 5 µs CPU GEMM (a clock
    read costs ~0.15 µs on this VM)."""
    def per_call(fn: Callable[[], object]) -> float:
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / calls)
        return best

    def noop() -> None:
        return None

    return max(0.0, per_call(_slow(noop, 0.0, 0.0)) - per_call(noop))


def _write(path: Path | None, doc: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def run_suite(suite: str, problems: Sequence[NamedProblem], target: Target, factory: Any, *,
              inductor: bool = False, time_budget_s: float | None = None,
              out: Path | None = None, inject_slowdown: float = 0.0,
              cpu_threads: int = CPU_THREADS,
              on_progress: Callable[[str, dict], None] | None = None) -> dict[str, Any]:
    """Benchmark ``problems`` on this machine's ``target``; returns (and writes to ``out``)
    the results document. On a CPU, implementations are timed with ``cpu_threads`` torch
    threads (0: torch's own setting; the autotuner's choice is made with torch's setting
    either way). ``inject_slowdown`` (a fraction, tests only) makes tilewright's measured calls
    that much slower (:func:`slowed`). The document records both.

    Raises:
        TilewrightError: the target is not on this machine, the slowdown cannot be injected,
            or ``cpu_threads`` is negative.
    """
    devices = local_devices(target)
    if not devices and (why := target.unavailable()) is not None:  # e.g. the SYCL runtime of xpu:opencl-cpu
        raise TilewrightError(f"target {target.name} cannot run on this machine: {why}")
    if not devices:
        raise TilewrightError(f"target {target.name} is not on this machine; run the suite "
                              f"where it is (bench/device_check.sh on a GPU machine)")
    device = torch.device(devices[0])
    check_slowdown(inject_slowdown, device)
    if cpu_threads < 0:
        raise TilewrightError(f"cpu_threads must be 0 (torch's setting) or more, not {cpu_threads}")
    doc: dict[str, Any] = {"format": FORMAT, "suite": suite, "created": time.time(),
                           "complete": False, "env": environment(target, device),
                           "settings": {k: v for k, v in config.as_dict().items()
                                        if k.startswith("bench_") or k in ("isolate", "max_candidates")}
                           | {"inject_slowdown": inject_slowdown,
                              "cpu_threads": cpu_threads if device.type == "cpu" else None},
                           "results": [], "skipped": []}
    # what the wrapper adds per kernel call (null kernel), beside Inductor's per-kernel figure
    doc["launch_overhead_us"] = launch_overhead(calls=5000, repeats=3)
    t0 = time.monotonic()
    aten = Candidate.of("aten.gemm", _aten_hash())
    with pool_scope(), torch.no_grad():
        for item in problems:
            if time_budget_s is not None and time.monotonic() - t0 > time_budget_s:
                doc["skipped"].append(item.name)
                continue
            row = _bench_one(item, target, factory, device, aten, inductor, inject_slowdown,
                             cpu_threads)
            doc["results"].append(row)
            _write(out, doc)
            if on_progress is not None:
                on_progress(item.name, row)
    doc["complete"] = not doc["skipped"]
    doc["seconds"] = time.monotonic() - t0
    _write(out, doc)
    return doc


def _aten_hash() -> str:
    from tilewright.templates import get_template

    return get_template("aten.gemm").source_hash


def _bench_one(item: NamedProblem, target: Target, factory: Any, device: torch.device,
               aten: Candidate, inductor: bool, slowdown: float = 0.0,
               cpu_threads: int = 0) -> dict[str, Any]:
    p = item.problem
    row: dict[str, Any] = {"id": item.name, "problem": p.to_json(), "describe": p.describe(),
                           "M": p.M, "N": p.N, "K": p.K, "batch": p.batch, "dtype": p.dtype,
                           "flops": p.flops, "bytes": p.min_bytes, "impls": {}}
    try:
        sel = select_gemm(p, target, factory)
    except TilewrightError as e:
        row["error"] = f"{type(e).__name__}: {e}"[:300]
        return row
    row["choice"], row["reason"] = sel.winner.name, sel.reason

    builders: dict[str, Callable[[], Callable]] = {
        "tilewright": lambda: factory.build(p, sel.winner, target),
        "aten": lambda: factory.build(p, aten, target)}
    sycl = _best_sycl(sel) if target.backend == "xpu" else None
    if sycl is not None:
        # the fastest SYCL candidate the tuner timed, beside its choice: on a CPU the choice is
        # often ATen, and the SYCL kernel's own time is what this comparison is for
        row["sycl_candidate"] = sycl.name
        builders["sycl"] = lambda: factory.build(p, sycl, target)
    if inductor:
        builders["inductor"] = lambda: _inductor_launch(p)
    with _torch_threads(cpu_threads if device.type == "cpu" else 0):
        runs = _checked_runs(p, builders, lambda x: factory.reference(p, x), device, target,
                             row["impls"])
        if slowdown and "tilewright" in runs:
            runs["tilewright"] = slowed(runs["tilewright"], slowdown, device)
        times, errors = time_side_by_side(runs, device)
    for name, ts in times.items():
        row["impls"][name] |= timing_summary(p, ts)
    for name, err in errors.items():
        row["impls"][name] = {"error": err}
    if "tilewright" in times and "aten" in times:
        # the gate's default metric: measured side by side, so machine drift cancels
        row["paired_vs_aten"] = paired_ratio(times["tilewright"], times["aten"])
    tw, at = row["impls"].get("tilewright", {}), row["impls"].get("aten", {})
    if tw.get("ms") and at.get("ms"):
        row["speedup_vs_aten"] = at["ms"] / tw["ms"]
    sy = row["impls"].get("sycl", {})
    if sy.get("ms") and at.get("ms"):
        row["sycl_speedup_vs_aten"] = at["ms"] / sy["ms"]
    return row


def _best_sycl(sel: Any) -> Candidate | None:
    """The SYCL candidate with the lowest measured time in a selection (None if none ran)."""
    timed = [r for r in sel.results if r.candidate.backend == "sycl"
             and r.record.status in ("ok", "aborted") and r.record.median_ms is not None]
    return min(timed, key=lambda r: r.record.median_ms).candidate if timed else None


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` inside (unchanged when ``n`` is 0)."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n:
            torch.set_num_threads(before)


def _inductor_launch(p: GemmProblem) -> Callable:
    fn = _inductor_fn(p)
    return lambda a, b, out=None: out.copy_(fn(a, b))


def _checked_runs(p: GemmProblem, builders: dict[str, Callable[[], Callable]],
                  reference: Callable, device: torch.device, target: Target,
                  impls: dict[str, dict]) -> dict[str, list[Callable[[], object]]]:
    """Build each implementation and check it against ``reference(inputs)`` (float64; its
    relative error goes into ``impls``); one that fails to build or run is recorded as an
    error there and not timed."""
    refs: list = []

    def ref(x):  # every implementation sees the same first input set: one reference per problem
        if not refs:
            refs.append(reference(x))
        return refs[0]

    runs: dict[str, list[Callable[[], object]]] = {}
    for name, build in builders.items():
        try:
            runs[name], err = _prepare(p, build(), device, ref, target.name)
            impls[name] = {"rel_err": err}
        except Exception as e:  # noqa: BLE001 - one implementation failing is a result
            impls[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    return runs


def run_model_cases(doc: dict[str, Any], cases: list[Any], selected: tuple[str, ...] | None,
                    time_budget_s: float | None, bench_one: Callable[[Any], dict[str, Any]],
                    out: Path | None, on_progress: Callable[[str, dict], None] | None, t0: float) -> None:
    """Run ``bench_one(case)`` for each case in ``selected`` (all when None) into
    ``doc["results"]``, rewriting ``out`` after each so a run cut short still reports. A case
    past ``time_budget_s`` (seconds since ``t0``) goes to ``doc["skipped"]``; a case that
    raises is a row with its ``error``, not the end of the run."""
    for case in cases:
        if selected is not None and case.name not in selected:
            continue
        if time_budget_s is not None and time.monotonic() - t0 > time_budget_s:
            doc["skipped"].append(case.name)
            continue
        try:
            row = bench_one(case)
        except Exception as e:  # noqa: BLE001 - one case failing is a result
            row = {"id": case.name, "describe": case.describe, "impls": {}, "error": f"{type(e).__name__}: {e}"[:300]}
        doc["results"].append(row)
        _write(out, doc)
        if on_progress is not None:
            on_progress(case.name, row)

