"""``tilewright bench run``: time tilewright's choice against ATen (and Inductor max-autotune)
for every problem of a suite, on this machine.

Per problem: the autotuner chooses (using and filling the tuning cache), then the chosen kernel,
ATen and optionally Inductor are each checked against the float64 reference and timed with the
same benchmarker, on the same rotated input sets. Each is recorded with its median time and
spread (ms), TFLOP/s (2·M·N·K·batch per time) and GB/s (minimum bytes moved per time). The
results file also records the target, arch, device name and the torch/triton/tilewright/CUDA
versions and the wrapper's own cost per kernel call (``launch_overhead_us``, µs, measured with a
null kernel: :mod:`tilewright.perf.launch`), and is rewritten after every problem, so a run cut
short still leaves its results.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from tilewright._config import config
from tilewright.autotune.bench import time_callable
from tilewright.autotune.cache import current_versions
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.evaluate import input_set_count
from tilewright.autotune.inputs import make_inputs, poisoned_output, rel_error
from tilewright.autotune.pool import pool_scope
from tilewright.autotune.select import local_devices, select_gemm
from tilewright.autotune.shapes import NamedProblem
from tilewright.errors import TilewrightError
from tilewright.perf.launch import launch_overhead
from tilewright.problem import GemmProblem
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
    if problem.epilogue:
        raise TilewrightError("Inductor comparison covers plain GEMMs only")
    fn = torch.bmm if problem.batched else torch.mm
    return torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)


def measure(problem: GemmProblem, launch: Callable, device: torch.device, reference: Callable,
            target: str, seed: int = 0) -> dict[str, Any]:
    """Check ``launch`` against the reference, then time it on rotated inputs.

    Returns ``{ms, spread_ms, reps, tflops, gbps, rel_err}`` (ms; TFLOP/s; GB/s)."""
    sets = [make_inputs(problem, device, seed + i) for i in range(input_set_count(problem, target))]
    outs = [poisoned_output(problem, device) for _ in sets]
    runs = [lambda x=x, o=o: launch(x.a, x.b, *x.epilogue_inputs, out=o) for x, o in zip(sets, outs)]
    first = runs[0]()
    err = rel_error(first, reference(sets[0]))
    t = time_callable(runs, device, warmup=config.bench_warmup, rep=config.bench_rep,
                      budget_ms=max(config.bench_budget_ms, 50.0), min_rep=config.bench_min_rep,
                      stable_pct=config.bench_stable_pct)
    return {"ms": t.median_ms, "spread_ms": t.spread_ms, "reps": t.reps, "rel_err": err,
            "tflops": problem.flops / (t.median_ms * 1e9) if t.median_ms > 0 else None,
            "gbps": problem.min_bytes / (t.median_ms * 1e6) if t.median_ms > 0 else None}


def _write(path: Path | None, doc: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def run_suite(suite: str, problems: Sequence[NamedProblem], target: Target, factory: Any, *,
              inductor: bool = False, time_budget_s: float | None = None,
              out: Path | None = None,
              on_progress: Callable[[str, dict], None] | None = None) -> dict[str, Any]:
    """Benchmark ``problems`` on this machine's ``target``; returns (and writes to ``out``)
    the results document.

    Raises:
        TilewrightError: the target is not on this machine.
    """
    devices = local_devices(target)
    if not devices:
        raise TilewrightError(f"target {target.name} is not on this machine; run the suite "
                              f"where it is (bench/device_check.sh on a GPU machine)")
    device = torch.device(devices[0])
    doc: dict[str, Any] = {"format": FORMAT, "suite": suite, "created": time.time(),
                           "complete": False, "env": environment(target, device),
                           "settings": {k: v for k, v in config.as_dict().items()
                                        if k.startswith("bench_") or k in ("isolate", "max_candidates")},
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
            row = _bench_one(item, target, factory, device, aten, inductor)
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
               aten: Candidate, inductor: bool) -> dict[str, Any]:
    p = item.problem
    row: dict[str, Any] = {"id": item.name, "problem": p.to_json(), "describe": p.describe(),
                           "M": p.M, "N": p.N, "K": p.K, "batch": p.batch, "dtype": p.dtype,
                           "flops": p.flops, "bytes": p.min_bytes, "impls": {}}

    refs: list = []

    def ref(x):  # every implementation sees the same first input set: one reference per problem
        if not refs:
            refs.append(factory.reference(p, x))
        return refs[0]

    try:
        sel = select_gemm(p, target, factory)
        row["choice"], row["reason"] = sel.winner.name, sel.reason
        impls = {"tilewright": sel.winner, "aten": aten}
        for name, cand in impls.items():
            try:
                row["impls"][name] = measure(p, factory.build(p, cand, target), device, ref,
                                             target.name)
            except Exception as e:  # noqa: BLE001 - one implementation failing is a result
                row["impls"][name] = {"error": f"{type(e).__name__}: {e}"[:300]}
        if inductor:
            try:
                fn = _inductor_fn(p)
                row["impls"]["inductor"] = measure(p, lambda a, b, out=None: out.copy_(fn(a, b)),
                                                   device, ref, target.name)
            except Exception as e:  # noqa: BLE001
                row["impls"]["inductor"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    except TilewrightError as e:
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    tw, at = row["impls"].get("tilewright", {}), row["impls"].get("aten", {})
    if tw.get("ms") and at.get("ms"):
        row["speedup_vs_aten"] = at["ms"] / tw["ms"]
    return row
