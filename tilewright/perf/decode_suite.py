"""``tilewright bench run --suite decode``: a decode step and a prefill of tiny Llama and Qwen3
models (:mod:`.decode_cases`), eager vs tilewright vs Inductor in one process, interleaved.

Per case, each side compiles the same forward function (its first call, compile included, is
timed in this process: ``first_call_s``), then all sides are timed round by round in turn
(:func:`tilewright.perf.run.time_side_by_side`: ABBA order, so drift touches all alike). The
sides:

* ``aten``: eager, PyTorch op by op (the reference of ``paired_vs_aten`` and ``rel_err``);
* ``tilewright``: ``backend="tilewright"`` with the settings in force. On a CPU the graph race
  (``TILEWRIGHT_GRAPH_RACE``, :mod:`tilewright.compiler.race`) may keep eager's own ops for a
  graph; the row's ``race`` lists what each graph's race decided, and the model is called until
  every race is decided before timing;
* ``tilewright-race-off`` (CPU): the same with ``graph_race="off"``: the generated kernels'
  own time, whatever the race would choose;
* ``inductor``: ``backend="inductor"`` (default mode);
* on a GPU also ``tilewright-cudagraphs`` and ``inductor-cudagraphs``: both with
  ``mode="reduce-overhead"`` (PyTorch's CUDA-graph trees; :mod:`tilewright.compiler.cudagraphs`),
  with each graph's recordings and replays in the row's ``cudagraphs``.

On a CPU with one torch thread (the default) a call is timed in CPU time of the thread
(:func:`tilewright.perf.cpu_suite.thread_ms`); on a GPU by the benchmarker's events. Rows hold
``paired_vs_aten`` (tilewright over eager, round by round), ``paired_vs_inductor`` and
``paired`` (every side over eager), in the format ``bench compare`` reads.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

from tilewright._config import config
from tilewright.perf.decode_cases import CASES, DecodeCase, build_model, forward_fn, inputs, side_step
from tilewright.perf.frames import fresh_code
from tilewright.perf.run import (FORMAT, _torch_threads, _write, environment, paired_ratio, run_model_cases,
                                 time_side_by_side)

SUITE = "decode"
GPU_SIDES = ("tilewright-cudagraphs", "inductor-cudagraphs")


def _sides(device: torch.device, inductor: bool) -> dict[str, tuple[str | None, dict[str, Any], dict[str, Any]]]:
    """side -> (backend or None for eager, torch.compile keywords, tilewright settings)."""
    sides: dict[str, tuple[str | None, dict[str, Any], dict[str, Any]]] = {
        "aten": (None, {}, {}), "tilewright": ("tilewright", {}, {})}
    if device.type == "cpu":
        sides["tilewright-race-off"] = ("tilewright", {}, {"graph_race": "off"})
    else:
        sides["tilewright-cudagraphs"] = ("tilewright", {"mode": "reduce-overhead"}, {})
    if inductor:
        sides["inductor"] = ("inductor", {}, {})
        if device.type == "cuda":
            sides["inductor-cudagraphs"] = ("inductor", {"mode": "reduce-overhead"}, {})
    return sides


def _backend(name: str, settings: dict[str, Any]) -> Any:
    """The backend to compile a side with. Dynamo shares compiled code between equal backends
    (the same name, mode and options), so a side with settings of its own gets a backend
    object of its own, which compiles under those settings (they apply at compile time)."""
    if not settings:
        return name
    from tilewright.compiler.backend import tilewright_backend

    def backend(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: Any) -> Any:
        with config.patch(**settings):
            return tilewright_backend(gm, example_inputs, **kwargs)
    return backend


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.detach().double(), ref.detach().double()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


def bench_decode_case(case: DecodeCase, device: torch.device, dtype: torch.dtype, *, inductor: bool = True,
                      cpu_threads: int = 1) -> dict[str, Any]:
    """One row of the results (see the module docstring)."""
    import torch._dynamo

    from tilewright.compiler.race import calls_to_decide
    from tilewright.compiler.report import collect_reports
    from tilewright.perf.cpu_suite import thread_ms, timing_summary_plain

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 32)
    torch._dynamo.reset()  # the earlier cases' code is not called again
    row: dict[str, Any] = {"id": case.name, "describe": case.describe, "impls": {}}
    runs: dict[str, list[Callable[[], object]]] = {}
    reports: dict[str, list] = {}
    with _torch_threads(cpu_threads if device.type == "cpu" else 0):
        model = build_model(case.model, dtype, device)
        x = inputs(case, device)
        ref = side_step(case, model, forward_fn(model), x, dtype, device)().clone()
        for name, (backend, kwargs, settings) in _sides(device, inductor).items():
            try:
                fn = forward_fn(model)
                if backend is not None:
                    # a frame of its own: every side compiles this function, and Dynamo would
                    # check the other sides' cache entries first (frames.py)
                    fn = torch.compile(fresh_code(fn), backend=_backend(backend, settings), **kwargs)
                with collect_reports() as reps:
                    step = side_step(case, model, fn, x, dtype, device)
                    t0 = time.perf_counter()
                    out = step().clone()  # a CUDA graph's output is overwritten by its next replay
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    first = time.perf_counter() - t0
                    for _ in range(calls_to_decide()):  # races decided, graphs recorded
                        step()
                runs[name] = [step]
                reports[name] = list(reps)
                row["impls"][name] = {"rel_err": _rel_err(out, ref)} | (
                    {"first_call_s": first} if backend is not None else {})
            except Exception as e:  # noqa: BLE001 - one side failing is a result
                row["impls"][name] = {"error": f"{type(e).__name__}: {e}"[:300]}
        clock = thread_ms if device.type == "cpu" and cpu_threads == 1 else None
        times, errors = time_side_by_side(runs, device, pair=("tilewright", "aten"), clock=clock)
    for name, ts in times.items():
        row["impls"][name] |= timing_summary_plain(ts)
    for name, err in errors.items():
        row["impls"][name] = {"error": err}
    if "aten" in times:
        row["paired"] = {name: paired_ratio(ts, times["aten"])["ratio"]
                         for name, ts in times.items() if name != "aten"}
    if "tilewright" in times and "aten" in times:
        row["paired_vs_aten"] = paired_ratio(times["tilewright"], times["aten"])
        row["speedup_vs_aten"] = row["impls"]["aten"]["ms"] / row["impls"]["tilewright"]["ms"]
    if "tilewright" in times and "inductor" in times:
        row["paired_vs_inductor"] = paired_ratio(times["tilewright"], times["inductor"])
    tw = reports.get("tilewright", [])
    row["graphs"] = len(tw)
    row["fallbacks"] = [r.fallback for r in tw if r.fallback]
    row["race"] = [{"graph": f"{r.kind} {r.graph_id}", **r.race} for r in tw if r.race]
    row["cudagraphs"] = [{"graph": f"{r.kind} {r.graph_id}", **r.cudagraphs}
                         for r in reports.get("tilewright-cudagraphs", []) if r.cudagraphs]
    return row


def run_decode_suite(*, device: str | None = None, dtype: str | None = None, inductor: bool = True,
                     cpu_threads: int = 1, out: Path | None = None, cases: tuple[str, ...] | None = None,
                     time_budget_s: float | None = None,
                     on_progress: Callable[[str, dict], None] | None = None) -> dict[str, Any]:
    """Run the ``decode`` suite; returns (and writes to ``out`` after every case) the results
    document, in the format of :func:`tilewright.perf.run.run_suite`'s.

    Args:
        device: "cpu" or "cuda" (default: this machine's GPU, else the CPU).
        dtype: "fp32" or "bf16" (default: fp32 on a CPU, bf16 on a GPU).
        inductor: time Inductor beside (and on a GPU its reduce-overhead mode).
        cpu_threads: torch threads on a CPU (0: torch's own setting).
        cases: only the cases with these names.
        time_budget_s: start no new case after this long (the rest are listed as skipped).

    Raises:
        KeyError: an unknown dtype.
    """
    from tilewright.runtime.targets import detect_target

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype or ("fp32" if dev.type == "cpu" else "bf16")]
    doc: dict[str, Any] = {"format": FORMAT, "suite": SUITE, "created": time.time(), "complete": False,
                           "env": environment(detect_target(dev.type), dev),
                           "settings": {k: v for k, v in config.as_dict().items() if k.startswith("bench_")}
                           | {"cpu_threads": cpu_threads, "inductor": inductor, "reference": "eager",
                              "dtype": str(dt).removeprefix("torch."), "graph_race": config.graph_race,
                              "clock": "thread CPU time" if dev.type == "cpu" and cpu_threads == 1
                              else ("wall" if dev.type == "cpu" else "CUDA events"),
                              "first_call": "in process, compile included"},
                           "results": [], "skipped": []}
    t0 = time.monotonic()
    run_model_cases(doc, CASES, cases, time_budget_s, out=out, on_progress=on_progress, t0=t0,
                    bench_one=lambda case: bench_decode_case(case, dev, dt, inductor=inductor, cpu_threads=cpu_threads))
    doc["complete"] = not doc["skipped"]
    doc["seconds"] = time.monotonic() - t0
    _write(out, doc)
    return doc


def decode_results_table(doc: dict[str, Any]) -> Any:
    """A rich ``Table``: one row per case, each side's ms and its time over eager's."""
    from rich.table import Table

    env = doc["env"]
    sides = [s for s in ("aten", "tilewright", "tilewright-race-off", "tilewright-cudagraphs", "inductor",
                         "inductor-cudagraphs") if any(s in r.get("impls", {}) for r in doc["results"])]
    table = Table(title=f"suite decode on {env['device']} ({env['target']}), torch {env['versions']['torch']}, "
                        f"{doc['settings'].get('dtype')}; ms (x eager, paired)")
    for col in ["case", *("eager" if s == "aten" else s for s in sides), "race", "CUDA graphs"]:
        table.add_column(col, overflow="fold")
    for r in doc["results"]:
        cells = []
        for s in sides:
            impl = r.get("impls", {}).get(s, {})
            ratio = r.get("paired", {}).get(s)
            cells.append(impl.get("error", "-")[:40] if "ms" not in impl else
                         f"{impl['ms']:.4g}" + (f" ({ratio:.2f}x)" if ratio else ""))
        race = ", ".join(f"{g['graph']}: {g['winner']}" for g in r.get("race", []))
        cg = ", ".join(f"{g['graph']}: {g.get('replays', 0)} replays" if g.get("status") == "on"
                       else f"{g['graph']}: {g.get('reason', '')[:40]}" for g in r.get("cudagraphs", []))
        table.add_row(r["id"], *cells, race or "-", cg or "-")
    return table


def decode_summary(doc: dict[str, Any]) -> tuple[str, str]:
    """(headline, detail) of a results document in one line each, for a device check's table:
    the cases measured, and per case each side's paired time over eager's (x eager) and the
    CUDA-graph replays of the tilewright side."""
    rows = doc.get("results", [])
    ok = [r for r in rows if not r.get("error") and "paired" in r]
    head = f"{len(ok)}/{len(rows) + len(doc.get('skipped', []))} cases"
    short = {"tilewright": "tw", "tilewright-race-off": "tw race-off", "tilewright-cudagraphs": "tw+CG",
             "inductor": "ind", "inductor-cudagraphs": "ind+CG"}
    parts = []
    for r in ok:
        sides = ", ".join(f"{short.get(s, s)} {x:.2f}x" for s, x in r["paired"].items())
        replays = sum(g.get("replays", 0) for g in r.get("cudagraphs", []))
        parts.append(f"{r['id'].removeprefix('decode.')}: {sides}" + (f" ({replays} replays)" if replays else ""))
    errors = [r["id"] for r in rows if r not in ok]
    return head, "; ".join(parts) + (f"; failed: {', '.join(errors)}" if errors else "")
