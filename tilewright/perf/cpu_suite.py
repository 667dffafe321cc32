"""``tilewright bench run --suite cpu``: eager, Inductor and tilewright on the CPU, side by side.

Where the GEMM suites time one problem's kernels, this suite times whole functions and models as
a user runs them: a few kernels (RMSNorm, softmax, LayerNorm + GELU), one Llama decoder block,
small held-out-style models (a 2-layer MLP, GPT-2 and BERT tiny with random weights) and the
demo's models (MiniLM, Llama inference and a training step, a Qwen3-MoE training step).
Per case:

* **first call**: the compile and first call (wall time) of each backend, each in a **fresh
  process** (:mod:`tilewright.perf.first_call`), as a user's first call is: the backend pays its
  own imports and one-time setup (Inductor's C++ toolchain and ISA probes and compile workers,
  our C++ toolchain probe), and no in-memory cache carries over from another case. Caches start
  empty: tilewright's ``cache_dir`` a fresh folder, Inductor *cold* (its FX graph and autograd
  caches off, a fresh ``TORCHINDUCTOR_CACHE_DIR``). In that process an ``aot_eager`` compile of
  the case runs first, untimed, so Dynamo's own one-time warm-up lands on neither backend. The
  steady-state models below are then compiled in this process from those folders (tilewright
  reuses the child's tuning records, Inductor its built kernels), untimed. The ``cpu-ci``
  variant (CI) times first calls in this process instead (``--first-call inline``: a fresh
  process per case costs 5-10 s more each on CI), after the untimed ``aot_eager`` compile, so
  there its first case carries the one-time costs and later cases find the earlier ones'.
* **steady state**: eager (recorded as ``aten``, the gate's reference: PyTorch running op by op),
  tilewright and Inductor timed interleaved, round by round
  (:func:`tilewright.perf.run.time_side_by_side`), with ``cpu_threads`` torch threads (1 by
  default, as the GEMM suites: a thread pool on a busy host times the scheduler), by the CPU
  time of the thread with one thread (:func:`thread_ms`), else wall time. Whatever kernel
  the tuner picked is what runs: new CPU templates show up here with no change to the suite.
  Each compiled side is a copy of the model with Dynamo frames of its own
  (:func:`tilewright.perf.frames.own_frames`), as a process compiling its model once has.
* **Dynamo's floor** (``dynamo``): the case compiled with ``backend="eager"`` (Dynamo's graph
  run op by op) is timed in the same rounds. Dynamo's frame costs a call its guards and the
  wrappers around the compiled function whatever the backend returns (measured on this
  project's 2-core machine: ~25 us a call with warm caches, 50-130 us after a kernel that
  streamed megabytes through them), so a graph whose race kept eager's ops runs at this floor,
  not at eager's time: ``dynamo_paired_vs_aten`` is the floor over eager and
  ``paired_vs_dynamo`` the default side over the floor (what the backend adds beyond Dynamo).
* **the graph race** (:mod:`tilewright.compiler.race`): tilewright's model is called until each
  graph's race is decided before timing, and the row lists each graph's outcome (``race``).
* **ATen calls per call**, eager's and tilewright's, profiler-counted
  (:mod:`tilewright.compiler.dispatches`), and the relative error of tilewright's result against
  eager's.

Rows are in the format ``bench compare`` gates: ``paired_vs_aten`` is tilewright's time over
eager's, round by round, so machine drift cancels. ``paired_vs_inductor`` and
``first_call_vs_inductor`` are recorded beside it, not gated; the document's
``settings.first_call`` says how first calls were timed. The ``cpu-ci`` variant is the kernels
and the block at small sizes and the MLP, without Inductor unless asked: what CI runs.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from tilewright._config import config
from tilewright.perf.cpu_cases import (  # noqa: F401 - the cases' names, re-exported
    CI_CASES, DEMO_CASES, KERNEL_CASES, MODEL_CASES, MODEL_SUITES, Case, LlamaBlock, Setup, find_case,
)
from tilewright.perf.first_call import FirstCallError, compile_bytecode, first_call_s
from tilewright.perf.frames import own_frames
from tilewright.perf.load import LoadProbe, load_per_cpu
from tilewright.perf.run import (
    FORMAT, _torch_threads, _write, check_slowdown, environment, paired_ratio, run_model_cases, slowed,
    time_side_by_side,
)
from tilewright.runtime.targets import get_target


# -- running ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def _inductor_cold(folder: Path | None = None) -> Iterator[None]:
    """Inductor without its FX graph and autograd caches, its compile cache in ``folder`` (a
    fresh temporary one when None)."""
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="tw-inductor-") as fresh:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder or fresh)
        try:
            with torch._inductor.config.patch(fx_graph_cache=False), \
                    torch._functorch.config.patch(enable_autograd_cache=False):
                yield
        finally:
            if old is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


def _first_call(setup: Setup, backend: str, cold: Callable[[], Any]) -> tuple[Any, Callable[[], Any], float]:
    """(compiled model, its step, seconds of compile + first call), in this process."""
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
    # frames of its own: the other compiled copies' cache entries would be checked first (frames.py)
    model = torch.compile(own_frames(setup.make()), backend=backend, fullgraph=setup.fullgraph)
    with cold():
        t0 = time.perf_counter()
        setup.step(model)
        seconds = time.perf_counter() - t0
    return model, (lambda: setup.step(model)), seconds


def _fresh_first_calls(suite: str, case: Case, backends: tuple[str, ...], cpu_threads: int,
                       folder: Path) -> dict[str, dict[str, Any]]:
    """Per backend, ``{"first_call_s": wall s, "first_call_cpu_s": CPU s}`` timed in a fresh
    process (:mod:`.first_call`; on a busy host wall time includes waiting for a core), or
    ``{"first_call_error": why}``. tilewright's child tunes into ``folder / "tilewright"`` and
    Inductor's builds into ``folder / "inductor"``, both empty before; this process then
    compiles its steady-state models from them (so it does not tune everything again)."""
    out: dict[str, dict[str, Any]] = {}
    for backend in backends:
        try:
            tw_dir = folder / ("tilewright" if backend == "tilewright" else f"{backend}-tw")
            ind_dir = folder / ("inductor" if backend == "inductor" else f"{backend}-ind")
            r = first_call_s(suite, case.name, backend, cpu_threads=cpu_threads, cache_dir=tw_dir,
                             inductor_dir=ind_dir)
            out[backend] = {"first_call_s": r["first_call_s"], "first_call_cpu_s": r["cpu_s"]}
        except FirstCallError as e:
            out[backend] = {"first_call_error": str(e)}
    return out


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.detach().double(), ref.detach().double()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


def _choices(reports: list) -> str:
    """What the tuner picked for the loop kernels and GEMMs, as counts per template."""
    counts = Counter(k.winner.split("[")[0] for r in reports for k in r.kernels)
    counts.update(g.winner.split("[")[0] for r in reports for g in r.gemms)
    return ", ".join(f"{n} {t}" for t, n in counts.most_common())


RACE_OFF = "tilewright_race_off"
"""The implementation name of the race-off side: the generated graph itself, every call."""
DYNAMO = "dynamo"
"""The implementation name of Dynamo's floor: ``torch.compile(backend="eager")``, Dynamo's graph
run op by op through Dynamo's frame (its guards, its wrappers around the compiled function), the
least any ``torch.compile`` backend costs a call, and what a tilewright graph whose race kept
eager's ops runs."""


def _race_off_backend() -> Callable:
    """tilewright's backend with the graph race off, as a callable of its own: Dynamo keeps a
    compiled frame per backend, so this compiles the case again beside the default model
    instead of reusing its graphs. The backward, compiled at the first backward call, takes the
    settings of its forward's compile (race off too)."""
    from tilewright.compiler.backend import tilewright_backend

    def race_off(gm: Any, example_inputs: list, **kwargs: Any) -> Callable:
        with config.patch(graph_race="off"):
            return tilewright_backend(gm, example_inputs, **kwargs)
    return race_off


def bench_case(case: Case, inductor: bool, cpu_threads: int, tune_dir: Path, *,
               suite: str | None = None, inject_slowdown: float = 0.0) -> dict[str, Any]:
    """One row of the results (see the module docstring). With ``suite``, first calls are timed
    each in a fresh process (:mod:`.first_call`, the case found by its name in ``suite``);
    without, in this one. ``inject_slowdown`` (tests) makes both tilewright sides' timed calls
    that much slower (:func:`tilewright.perf.run.slowed`)."""
    from tilewright.compiler.dispatches import counting
    from tilewright.compiler.race import calls_to_decide
    from tilewright.compiler.report import collect_reports

    row: dict[str, Any] = {"id": case.name, "describe": case.describe, "impls": {}}
    folder = tune_dir / case.name
    # each row compiles as a process running only its model would: after an earlier row compiled
    # the same model classes at another config, Dynamo's automatic dynamic shapes recompiles this
    # row's code with an int made a SymInt input (the Llama training step after the Llama bf16
    # row: its graphs then take 1.35x their static time, 1.24-1.30x Inductor's where the static
    # ones take 1.08-1.09x; measured). Dynamic graphs are a suite of their own (``decode``)
    torch._dynamo.reset()
    fresh = (_fresh_first_calls(suite, case, ("tilewright", "inductor") if inductor else ("tilewright",),
                                cpu_threads, folder) if suite is not None else {})
    with _torch_threads(cpu_threads):
        setup = case.build()
        eager_model = setup.make()
        ref = setup.step(eager_model)
        _first_call(setup, "aot_eager", contextlib.nullcontext)  # Dynamo's one-time costs
        with config.patch(cache_dir=str(folder / "tilewright")):
            with collect_reports() as reports:
                tw_model, tw_step, tw_first = _first_call(setup, "tilewright", contextlib.nullcontext)
                for _ in range(calls_to_decide()):  # steady state: the race decided
                    tw_step()
            # the same graphs with the race off (the tuning records are the default model's)
            with collect_reports() as off_reports:
                _, off_step, _ = _first_call(setup, _race_off_backend(), contextlib.nullcontext)
        _, floor_step, _ = _first_call(setup, "eager", contextlib.nullcontext)
        runs = {"aten": [lambda: setup.step(eager_model)], "tilewright": [tw_step], RACE_OFF: [off_step],
                DYNAMO: [floor_step]}
        row["impls"]["tilewright"] = fresh.get("tilewright", {"first_call_s": tw_first}) \
            | {"rel_err": _rel_err(tw_step(), ref)}
        row["impls"][RACE_OFF] = {"rel_err": _rel_err(off_step(), ref)}
        row["impls"]["aten"] = {"rel_err": 0.0}
        row["impls"][DYNAMO] = {"rel_err": _rel_err(floor_step(), ref)}
        if inductor:
            cold = (lambda: _inductor_cold(folder / "inductor")) if suite is not None else _inductor_cold
            _, ind_step, ind_first = _first_call(setup, "inductor", cold)
            runs["inductor"] = [ind_step]
            row["impls"]["inductor"] = fresh.get("inductor", {"first_call_s": ind_first}) \
                | {"rel_err": _rel_err(ind_step(), ref)}
        if inject_slowdown:
            for name in ("tilewright", RACE_OFF):
                runs[name] = slowed(runs[name], inject_slowdown, torch.device("cpu"))
        with LoadProbe() as probe:
            times, errors = time_side_by_side(runs, torch.device("cpu"), pair=(RACE_OFF, "aten"),
                                              clock=thread_ms if cpu_threads == 1 else None)
        with counting(reports) as ours:
            tw_step()
        with counting(off_reports) as raw:
            off_step()
        with counting() as theirs:
            setup.step(eager_model)
    for name, ts in times.items():
        row["impls"][name] |= timing_summary_plain(ts)
    for name, err in errors.items():
        row["impls"][name] = {"error": err}
    row["impls"]["tilewright"]["dispatches"] = ours.total
    row["impls"][RACE_OFF]["dispatches"] = raw.total
    row["impls"]["aten"]["dispatches"] = theirs.total
    row["load"] = probe.summary()
    row["choice"] = _choices(reports)
    row["race"] = [{"graph": f"{r.kind} {r.graph_id}", **r.race} for r in reports if r.race]
    row["graphs"] = len(reports)
    _pair(row, times, "tilewright", "")
    _pair(row, times, RACE_OFF, "race_off_")
    if DYNAMO in times and "aten" in times:
        # Dynamo's floor over eager, and the default side over that floor: what the backend adds
        # to a call beyond Dynamo's own cost (at most 1 where the race kept eager's ops)
        row["dynamo_paired_vs_aten"] = paired_ratio(times[DYNAMO], times["aten"])
        if "tilewright" in times:
            row["paired_vs_dynamo"] = paired_ratio(times["tilewright"], times[DYNAMO])
    tw_s, ind_s = (row["impls"].get(k, {}).get("first_call_s") for k in ("tilewright", "inductor"))
    if tw_s and ind_s:
        row["first_call_vs_inductor"] = tw_s / ind_s
    return row


def _pair(row: dict[str, Any], times: dict[str, list[float]], impl: str, prefix: str) -> None:
    """``{prefix}paired_vs_aten`` / ``_vs_inductor`` and ``{prefix}speedup_vs_aten`` of one
    tilewright side (``paired_vs_aten`` for the default one, as the GEMM suites name it)."""
    if impl in times and "aten" in times:
        row[f"{prefix}paired_vs_aten"] = paired_ratio(times[impl], times["aten"])
        row[f"{prefix}speedup_vs_aten"] = row["impls"]["aten"]["ms"] / row["impls"][impl]["ms"]
    if impl in times and "inductor" in times:
        row[f"{prefix}paired_vs_inductor"] = paired_ratio(times[impl], times["inductor"])


def thread_ms(fn: Callable[[], object]) -> float:
    """CPU time of the calling thread over one call, ms. With one torch thread every op runs on
    it, and on a busy host (this project's 2 cores carry ~10 jobs) wall time would mostly
    measure waiting for a core: measured, medians of wall time spread 3-5x between runs where
    thread time stays within ~10%."""
    t0 = time.thread_time()
    fn()
    return (time.thread_time() - t0) * 1e3


def timing_summary_plain(times: list[float]) -> dict[str, Any]:
    """``{ms, spread_ms, reps}`` of one implementation's times (no FLOP or byte count here)."""
    from tilewright.autotune.bench import summarise

    t = summarise(times)
    return {"ms": t.median_ms, "spread_ms": t.spread_ms, "reps": t.reps}


def run_model_suite(suite: str, *, inductor: bool | None = None, cpu_threads: int = 1,
                    out: Path | None = None, time_budget_s: float | None = None,
                    cases: tuple[str, ...] | None = None, fresh_process: bool | None = None,
                    inject_slowdown: float = 0.0,
                    on_progress: Callable[[str, dict], None] | None = None) -> dict[str, Any]:
    """Run a model suite (``cpu``, ``cpu-ci``); returns (and writes to ``out`` after every case)
    the results document, in the format of :func:`tilewright.perf.run.run_suite`'s.

    Args:
        inductor: time Inductor beside (default: the suite's own default).
        cpu_threads: torch threads for everything in a case, compile and tuning included.
        time_budget_s: start no new case after this long (the rest are listed as skipped).
        cases: only the cases with these names.
        fresh_process: time each first call in a fresh process (:mod:`.first_call`; default:
            the suite's own default, on for ``cpu``, off for ``cpu-ci``).
        inject_slowdown: a fraction (tests, ``bench/gate_noise.py``): both tilewright sides'
            timed calls are made that much slower for real (:func:`tilewright.perf.run.slowed`).

    Raises:
        KeyError: an unknown suite.
        TilewrightError: a negative ``inject_slowdown``.
    """
    check_slowdown(inject_slowdown, torch.device("cpu"))
    all_cases, default_inductor, default_fresh = MODEL_SUITES[suite]
    inductor = default_inductor if inductor is None else inductor
    fresh_process = default_fresh if fresh_process is None else fresh_process
    doc: dict[str, Any] = {"format": FORMAT, "suite": suite, "created": time.time(), "complete": False,
                           "env": environment(get_target("cpu"), torch.device("cpu"))
                           | {"load_per_cpu_start": load_per_cpu(), "cpus": os.cpu_count()},
                           "settings": {k: v for k, v in config.as_dict().items() if k.startswith("bench_")}
                           | {"cpu_threads": cpu_threads, "inductor": inductor, "reference": "eager",
                              "clock": "thread CPU time" if cpu_threads == 1 else "wall",
                              "inject_slowdown": inject_slowdown, "gated": RACE_OFF,
                              "first_call": "a fresh process per case and backend" if fresh_process
                              else "in process, after the earlier cases"},
                           "results": [], "skipped": []}
    t0 = time.monotonic()
    if fresh_process:
        compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="tw-bench-cpu-") as tune_dir:
        run_model_cases(doc, all_cases, cases, time_budget_s, out=out, on_progress=on_progress, t0=t0,
                        bench_one=lambda case: bench_case(case, inductor, cpu_threads, Path(tune_dir),
                                                          suite=suite if fresh_process else None,
                                                          inject_slowdown=inject_slowdown))
    doc["complete"] = not doc["skipped"]
    doc["seconds"] = time.monotonic() - t0
    doc["env"]["load_per_cpu_end"] = load_per_cpu()
    _write(out, doc)
    return doc
