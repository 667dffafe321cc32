"""``tilewright bench run / compare / show``: the performance gate."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table
from rich.text import Text

from tilewright.cli.common import console

# perf.compare.DEFAULT_MAX_REGRESSION, spelled out: importing it would load torch for every command
DEFAULT_MAX_REGRESSION = "5%"


def _f(x, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def results_table(doc: dict) -> Table:
    """One row per problem of a results document."""
    env = doc["env"]
    table = Table(title=f"suite {doc['suite']} on {env['device']} ({env['target']}), "
                        f"torch {env['versions']['torch']} triton {env['versions']['triton']}")
    sycl = any("sycl" in r.get("impls", {}) for r in doc["results"])  # xpu targets: SYCL's own time
    for col in ("problem", "choice", "tilewright ms", "±", "TFLOP/s", "GB/s", "ATen ms",
                "speed-up", "inductor ms") + (("SYCL ms", "SYCL vs ATen") if sycl else ()):
        table.add_column(col, overflow="fold")
    for r in doc["results"]:
        tw, at, ind, sy = (r.get("impls", {}).get(k, {}) for k in ("tilewright", "aten", "inductor", "sycl"))
        extra = (_f(sy.get("ms")), _f(r.get("sycl_speedup_vs_aten"), ".2f")) if sycl else ()
        table.add_row(r["id"], r.get("choice", r.get("error", "-"))[:40], _f(tw.get("ms")),
                      _f(tw.get("spread_ms"), ".2g"), _f(tw.get("tflops"), ".1f"),
                      _f(tw.get("gbps"), ".0f"), _f(at.get("ms")),
                      _f(r.get("speedup_vs_aten"), ".2f"), _f(ind.get("ms")) if ind else "-", *extra)
    return table


def model_results_table(doc: dict) -> Table:
    """One row per case of a model suite (``cpu``): steady state and first call of each. Two
    tilewright sides: ``race off`` is the generated graph itself on every call (what the gate
    judges), ``default`` is what a user gets, the graph race on (the race may keep eager's ops
    for a graph: ``race`` says which side won each graph). ``Dynamo`` is Dynamo's floor
    (``backend="eager"``: Dynamo's graph op by op, what any ``torch.compile`` call costs at least)
    over eager, and ``vs Dynamo`` the default side over that floor."""
    env = doc["env"]
    table = Table(title=f"suite {doc['suite']} on {env['device']} ({env['target']}), torch "
                        f"{env['versions']['torch']}; eager = PyTorch op by op, "
                        f"{doc['settings'].get('cpu_threads')} thread(s); {_load_text(doc)}")
    for col in ("case", "eager ms", "race off ms", "vs eager", "vs Inductor", "default ms",
                "vs eager", "race", "Dynamo vs eager", "vs Dynamo", "Inductor ms",
                "ATen calls off/default (eager)", "1st call s", "Inductor 1st s", "load", "choice"):
        table.add_column(col, overflow="fold")
    for r in doc["results"]:
        tw, off, at, ind = (r.get("impls", {}).get(k, {})
                            for k in ("tilewright", "tilewright_race_off", "aten", "inductor"))

        def ratio(key: str) -> str:
            return _f((r.get(key) or {}).get("ratio"), ".3f")
        won = ",".join(sorted({g.get("winner", "?") for g in r.get("race") or []})) or "-"
        calls = f"{off.get('dispatches', '-')}/{tw.get('dispatches', '-')} ({at.get('dispatches', '-')})"
        load = r.get("load") or {}
        table.add_row(r["id"], _f(at.get("ms")), _f(off.get("ms")), ratio("race_off_paired_vs_aten"),
                      ratio("race_off_paired_vs_inductor"), _f(tw.get("ms")), ratio("paired_vs_aten"),
                      won, ratio("dynamo_paired_vs_aten"), ratio("paired_vs_dynamo"), _f(ind.get("ms")),
                      calls, _f(tw.get("first_call_s"), ".1f"), _f(ind.get("first_call_s"), ".1f"),
                      ("busy " if load.get("busy") else "") + _f(load.get("running_share"), ".2f"),
                      r.get("choice", r.get("error", "-"))[:60])
    return table


def _load_text(doc: dict) -> str:
    """The machine's load while the suite ran, in words (older files recorded none)."""
    env, rows = doc["env"], doc["results"]
    loads = [x for x in (env.get("load_per_cpu_start"), env.get("load_per_cpu_end")) if x is not None]
    if not loads:
        return "load not recorded"
    busy = sum(bool((r.get("load") or {}).get("busy")) for r in rows)
    return (f"load {max(loads):.1f} per CPU ({env.get('cpus', '?')} CPUs), {busy}/{len(rows)} "
            f"cases timed on a busy machine")


def cmd_run_models(args: argparse.Namespace) -> int:
    from tilewright.perf.compare import parse_percent
    from tilewright.perf.cpu_suite import run_model_suite

    with console.status(f"bench {args.suite} on cpu") as status:
        doc = run_model_suite(args.suite, inductor=True if args.inductor else None,
                              cpu_threads=args.cpu_threads, out=Path(args.out),
                              time_budget_s=args.time_budget_s,
                              cases=tuple(args.cases.split(",")) if args.cases else None,
                              fresh_process={"process": True, "inline": False}.get(args.first_call),
                              inject_slowdown=parse_percent(args.inject_slowdown),
                              on_progress=lambda name, row: status.update(f"done {name}"))
    console.print(model_results_table(doc))
    if doc["skipped"]:
        console.print(f"{len(doc['skipped'])} cases skipped: time budget spent", style="yellow")
    console.print(f"wrote {args.out}")
    return 0


def cmd_run_decode(args: argparse.Namespace) -> int:
    from tilewright.perf.decode_suite import decode_results_table, run_decode_suite

    device = "cpu" if (args.target or "").startswith("cpu") else None
    with console.status("bench decode") as status:
        doc = run_decode_suite(device=device, inductor=True, cpu_threads=args.cpu_threads, out=Path(args.out),
                               cases=tuple(args.cases.split(",")) if args.cases else None,
                               time_budget_s=args.time_budget_s,
                               on_progress=lambda name, row: status.update(f"done {name}"))
    console.print(decode_results_table(doc))
    if doc["skipped"]:
        console.print(f"{len(doc['skipped'])} cases skipped: time budget spent", style="yellow")
    console.print(f"wrote {args.out}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from tilewright.perf.cpu_suite import MODEL_SUITES

    if args.suite == "decode":
        return cmd_run_decode(args)
    if args.suite in MODEL_SUITES:
        return cmd_run_models(args)
    from tilewright.cli.warm import load_factory
    from tilewright.perf.compare import parse_percent
    from tilewright.perf.run import run_suite
    from tilewright.perf.suites import SUITE_TARGETS, suite_problems
    from tilewright.runtime.targets import detect_target, get_target

    problems = suite_problems(args.suite, args.shapes)
    if args.target or args.suite in SUITE_TARGETS:
        target = get_target(args.target or SUITE_TARGETS[args.suite])
    else:
        import torch

        target = detect_target("cuda" if torch.cuda.is_available() else "cpu")
    with console.status(f"bench {args.suite} ({len(problems)} problems) on {target.name}") as status:
        doc = run_suite(args.suite, problems, target, load_factory(args.factory),
                        inductor=args.inductor, time_budget_s=args.time_budget_s,
                        out=Path(args.out), inject_slowdown=parse_percent(args.inject_slowdown),
                        cpu_threads=args.cpu_threads,
                        on_progress=lambda name, row: status.update(f"done {name}"))
    console.print(results_table(doc))
    lo = doc.get("launch_overhead_us")
    if lo:
        console.print(f"wrapper cost per kernel call (null kernel): {lo['static']:.2f} µs static, "
                      f"{lo['dynamic']:.2f} µs with bucket dispatch (a plain Python call: "
                      f"{lo['python_call']:.2f} µs; Inductor's launcher: ~{lo['inductor_reference']:.0f} µs)")
    if doc["skipped"]:
        console.print(f"{len(doc['skipped'])} problems skipped: time budget spent", style="yellow")
    console.print(f"wrote {args.out}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from tilewright.perf.compare import load_results

    doc = load_results(args.results)
    if doc.get("suite") == "decode":
        from tilewright.perf.decode_suite import decode_results_table

        console.print(decode_results_table(doc))
        return 0
    is_model_suite = any("first_call_vs_inductor" in r or "dispatches" in r.get("impls", {}).get("aten", {})
                         for r in doc["results"])
    console.print(model_results_table(doc) if is_model_suite else results_table(doc))
    return 0


def compare_table(cmp) -> Table:
    """One row per problem of a comparison: the figure compared, its change, and the metric
    and threshold the verdict used."""
    unit = "tilewright/ATen" if cmp.metric == "ratio" else "tilewright ms"
    table = Table(title=f"tilewright bench compare: {cmp.rule()}")
    ms = cmp.metric == "ratio"  # the absolute metric's figures are the ms already
    for col in ("problem", "metric", f"base {unit}", f"new {unit}", "change", "threshold",
                *(("base → new ms",) if ms else ()), "speed-up vs ATen", "verdict"):
        table.add_column(col, overflow="fold")
    style = {"regression": "red", "missing": "red", "error": "red", "improvement": "green",
             "noisy": "yellow"}
    for r in cmp.rows:
        threshold = "-" if r.threshold is None else f"{r.threshold:.1%} ({r.threshold_source})"
        metric = (r.metric or "-") + (f"; {r.side}" if r.side else "")
        table.add_row(r.id, metric, _f(r.base), _f(r.new),
                      "-" if r.change is None else f"{r.change:+.1%}", threshold,
                      *((f"{_f(r.base_ms)} → {_f(r.new_ms)}",) if ms else ()),
                      f"{_f(r.base_speedup, '.2f')} → {_f(r.new_speedup, '.2f')}",
                      Text(r.verdict, style=style.get(r.verdict, "")))  # the console prints no markup
    return table


def cmd_compare(args: argparse.Namespace) -> int:
    from tilewright.perf.compare import compare, load_results, parse_percent
    from tilewright.perf.report import write_html, write_png

    new = load_results(args.new)
    base = load_results(args.base, suite=new.get("suite"), arch=new["env"].get("arch"))
    cmp = compare(base, new, parse_percent(args.max_regression), metric=args.metric,
                  allow_missing=args.allow_missing)
    console.print(compare_table(cmp))
    for which, fraction in cmp.injected.items():
        console.print(f"note: the {which} results were measured with an injected {fraction:.0%} "
                      "slowdown of tilewright (bench run --inject-slowdown, a test run)", style="yellow")
    if args.png:
        write_png(cmp, args.png)
        console.print(f"wrote {args.png}")
    if args.html:
        write_html(cmp, args.html)
        console.print(f"wrote {args.html}")
    if cmp.count("noisy"):
        console.print(f"{cmp.count('noisy')} problems changed by more than the floor but within "
                      "their noise: not failed, not resolved either (rerun, or raise "
                      "TILEWRIGHT_BENCH_REP / TILEWRIGHT_BENCH_BUDGET_MS)", style="yellow")
    busy = sum(r.busy for r in cmp.rows)
    if busy:
        console.print(f"{busy} problems were timed on a busy machine in one of the two runs: a change "
                      "within the busy allowance reads noisy; rerun both on a quiet machine to "
                      "gate them to the floor", style="yellow")
    counts = ", ".join(f"{v} {cmp.count(v)}"
                       for v in ("regression", "error", "missing", "improvement", "same", "noisy"))
    gm = cmp.geomean_speedup("new")
    # last, and short: CI logs show this line alone (bench/device_check.sh tails it)
    console.print(f"{'PASS' if cmp.passed else 'FAIL'}: {counts}; geomean speed-up vs ATen "
                  f"{_f(gm, '.3f')}; metric {cmp.metric}, floor {cmp.max_regression:.1%}")
    return 0 if cmp.passed else 1


COMPARE_HELP = """Fail (exit code 1) on a regression beyond noise, or on a problem missing from NEW.

--metric ratio (the default) compares tilewright's time over ATen's, both measured side by
side in the same run, between BASE and NEW: whatever slows the whole machine between two runs
(another job on a shared host, clocks) slows ATen alike and cancels, so two runs of unchanged
code pass on a busy machine while a real slowdown of tilewright still fails. A problem fails
when its ratio grew by more than max(--max-regression, 3 x the two runs' combined standard
error of the ratio). Model suites (cpu, cpu-ci) are judged on their race-off side (the
generated graph itself, TILEWRIGHT_GRAPH_RACE=off) where both files have it; a row timed on a
busy machine in either file (its thread ran under 85% of the wall time, or load above one per
CPU) reads noisy, not failed, for a change within the busy allowance (40%). --metric absolute compares tilewright's median ms (threshold:
max(--max-regression, 2 x the larger relative spread)); it also sees ATen/torch getting slower,
but needs a quiet machine (a dedicated GPU). Every row prints the metric and threshold its
verdict used."""


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="benchmark suites and the perf-regression gate")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    r = bsub.add_parser("run", help="time tilewright's choice vs ATen per problem of a suite")
    r.add_argument("--suite", required=True, help="tiny, sycl-cpu, llm-decode, llm-prefill, llm, h200-check, "
                                                  "nvfp4-decode, nvfp4-check; cpu, cpu-ci (models and kernels: "
                                                  "eager vs Inductor vs tilewright); decode (a decode "
                                                  "step and prefill of tiny Llama/Qwen3: eager vs "
                                                  "Inductor vs tilewright, CUDA graphs on a GPU)")
    r.add_argument("--cases", help="cpu and decode suites: only these comma-separated cases (cpu.softmax, "
                                   "demo.minilm, decode.llama.step, ...)")
    r.add_argument("--out", required=True, help="results JSON (rewritten after every problem)")
    r.add_argument("--target", help="default: this machine's GPU, else cpu (decode: cpu runs it on the CPU)")
    r.add_argument("--shapes", help="shapes file for the llm suites (default bench/cases/...)")
    r.add_argument("--inductor", action="store_true",
                   help="also time Inductor max-autotune (cpu suites: Inductor, on by default for cpu)")
    r.add_argument("--first-call", choices=("process", "inline"),
                   help="cpu suites: time each backend's first call in a fresh process per case "
                        "(process, the default of cpu) or in this process (inline, the default of cpu-ci)")
    r.add_argument("--time-budget-s", type=float, help="start no new problem after this long")
    r.add_argument("--factory", help=argparse.SUPPRESS)
    # tests only: make tilewright's measured calls this much slower (CPU), to show the gate
    # catches a real slowdown; the results file records it
    r.add_argument("--inject-slowdown", default="0%", help=argparse.SUPPRESS)
    r.add_argument("--cpu-threads", type=int, default=1,
                   help="torch threads while timing on a CPU (default 1: a thread pool on a "
                        "busy machine times the scheduler; 0: torch's own setting)")
    r.set_defaults(fn=cmd_run)
    c = bsub.add_parser("compare", help="fail on a regression beyond noise (exit code 1)",
                        description=COMPARE_HELP,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("base", help="baseline results file, or a folder like bench/baselines")
    c.add_argument("new", help="new results file")
    c.add_argument("--max-regression", default=DEFAULT_MAX_REGRESSION,
                   help="the floor: a smaller change never fails (default %(default)s)")
    c.add_argument("--metric", choices=("ratio", "absolute"), default="ratio",
                   help="ratio: tilewright ms / ATen ms, timed side by side in each run "
                        "(default; machine drift cancels); absolute: tilewright ms (a quiet GPU)")
    c.add_argument("--allow-missing", action="store_true", help="problems missing from NEW pass")
    c.add_argument("--html", help="write an HTML report with the plot")
    c.add_argument("--png", help="write the speed-up plot")
    c.set_defaults(fn=cmd_compare)
    s = bsub.add_parser("show", help="print a results file as a table")
    s.add_argument("results")
    s.set_defaults(fn=cmd_show)
