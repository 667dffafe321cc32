"""Does the perf gate cry wolf? Rerun unchanged code against one baseline and count failures;
then inject a real slowdown and check that it is caught.

    .venv/bin/python bench/gate_noise.py [--reruns 10] [--slowdown 10%] [--suite tiny]
                                         [--max-regression 5%] [--out-dir DIR] [--json FILE]
                                         [--fork]

Steps, each ``tilewright bench run`` in its own process (as CI runs it), all sharing one
private tuning cache (the baseline's run fills it, so every run times the same choices).
With ``--fork`` each run is a process forked from this one, which has imported torch and
tilewright already, instead of a fresh interpreter: the same command line through the same
``main``, without ~3 s of imports per run (the test suite's way; a fresh interpreter also
draws its own hash seed and address layout, which a forked one inherits):

1. a baseline run;
2. ``--reruns`` runs of the same, unchanged code;
3. one run with ``--inject-slowdown`` (tilewright's measured calls busy-wait that fraction of
   their own time after each call: the measured thing gets slower, no number is edited).

Every rerun and the slowed run are then compared with the baseline by
:func:`tilewright.perf.compare.compare` (what ``bench compare`` calls) under both metrics, so the
table shows the default ``ratio`` gate beside the ``absolute`` one on the same files. Exits 0
when the ratio gate failed no rerun and failed the slowed run; 1 otherwise. Wall times in s.
The injected slowdown works on the CPU timer only (the ``tiny`` suite on this machine, or the
model suite ``cpu-ci``, whose gated side is the race-off one).

On a busy machine (:mod:`tilewright.perf.load`: a model-suite row records how much of the wall
time its timed thread ran) the gate weighs a change against the busy allowance too, so the
slowed run is expected to read ``noisy`` there, not fail: the summary says ``flagged noisy
(busy machine)`` and that counts as the gate working; on a quiet machine it must fail.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from tilewright.perf.compare import (DEFAULT_MAX_REGRESSION, METRICS, compare,  # noqa: E402
                                     load_results, parse_percent)


def bench_run(out: Path, suite: str, cache: Path, slowdown: str = "0%", threads: int = 1,
              fork: bool = False) -> float:
    """One ``tilewright bench run`` in its own process: a fresh interpreter, or with ``fork``
    a child of this process (POSIX only) running the same arguments through
    ``tilewright.cli.main.main``. Returns the run's wall time (s).

    Raises:
        RuntimeError: the run failed (its output tail is in the message).
    """
    args = ["bench", "run", "--suite", suite, "--target", "cpu", "--out", str(out),
            "--inject-slowdown", slowdown, "--cpu-threads", str(threads)]
    t0 = time.monotonic()
    if fork:
        rc, output = _forked_run(args, cache)
    else:
        env = {**os.environ, "TILEWRIGHT_CACHE_DIR": str(cache),
               "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        proc = subprocess.run([sys.executable, "-m", "tilewright", *args], env=env,
                              capture_output=True, text=True)
        rc, output = proc.returncode, proc.stdout + proc.stderr
    if rc != 0:
        raise RuntimeError(f"tilewright {' '.join(args)} exited {rc}{' (forked)' if fork else ''}:\n"
                           f"{output[-2000:]}")
    return time.monotonic() - t0


def _forked_run(args: list[str], cache: Path) -> tuple[int, str]:
    """``tilewright <args>`` in a forked child, its output to a file; (exit status, output).

    The parent runs no torch op before forking (only imports), so the child starts with no
    thread pool to inherit; the child reads its cache folder from the environment as a fresh
    process would, and leaves with ``os._exit`` (no parent's atexit handlers run twice)."""
    # what a run imports, imported here once before the first fork (imports only: no torch op)
    import tilewright.cli.warm  # noqa: F401
    import tilewright.perf.cpu_suite  # noqa: F401
    import tilewright.perf.suites  # noqa: F401
    from tilewright.cli.main import main

    log = cache.parent / f"{Path(args[args.index('--out') + 1]).stem}.log"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child
        rc = 70
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.environ["TILEWRIGHT_CACHE_DIR"] = str(cache)
            import tilewright

            tilewright.config.reload_env()
            rc = main(args)
        except BaseException:  # noqa: BLE001 - the child reports everything through its status
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc if isinstance(rc, int) else 70)
    _, status = os.waitpid(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    return rc, log.read_text() if log.exists() else ""


def verdicts(base: Path, new: Path, floor: float) -> dict[str, dict]:
    """Per metric: passed, the regressed problems and the largest change (a fraction)."""
    b, n = load_results(base), load_results(new)
    out = {}
    for metric in METRICS:
        cmp = compare(b, n, floor, metric=metric)
        changes = [r.change for r in cmp.rows if r.change is not None]
        out[metric] = {"passed": cmp.passed,
                       "regressed": [r.id for r in cmp.rows if r.verdict == "regression"],
                       "noisy": [r.id for r in cmp.rows if r.verdict == "noisy"],
                       "busy": [r.id for r in cmp.rows if r.busy],
                       "max_change": max(changes) if changes else None,
                       "min_change": min(changes) if changes else None}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reruns", type=int, default=10, help="runs of unchanged code (default 10)")
    ap.add_argument("--slowdown", default="10%", help="the injected slowdown (default 10%%)")
    ap.add_argument("--suite", default="tiny", help="a CPU-sized suite (default tiny)")
    ap.add_argument("--max-regression", default=f"{DEFAULT_MAX_REGRESSION:.0%}",
                    help="the gate's floor (default %(default)s, bench compare's)")
    ap.add_argument("--cpu-threads", type=int, default=1,
                    help="bench run --cpu-threads (default 1; 0: torch's own setting)")
    ap.add_argument("--out-dir", help="where the results files go (default: a temporary folder)")
    ap.add_argument("--json", help="also write the summary here")
    ap.add_argument("--fork", action="store_true",
                    help="fork each run from this process instead of starting a fresh interpreter "
                         "(saves the imports; POSIX only)")
    args = ap.parse_args(argv)
    floor = parse_percent(args.max_regression)
    out = Path(args.out_dir or tempfile.mkdtemp(prefix="tilewright-gate-noise-"))
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"
    t0 = time.monotonic()

    base = out / "base.json"
    seconds = {"base": bench_run(base, args.suite, cache, threads=args.cpu_threads, fork=args.fork)}
    runs = {f"rerun{i + 1}": out / f"rerun{i + 1}.json" for i in range(args.reruns)}
    runs[f"slowed{args.slowdown}"] = out / "slowed.json"
    for name, path in runs.items():
        slowdown = args.slowdown if name.startswith("slowed") else "0%"
        seconds[name] = bench_run(path, args.suite, cache, slowdown, args.cpu_threads, args.fork)
    results = {name: verdicts(base, path, floor) for name, path in runs.items()}

    summary = _summary(results, args, time.monotonic() - t0, seconds, out)
    _print(results, summary)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    ratio = summary["ratio"]
    return 0 if ratio["rerun_failures"] == 0 and (ratio["slowdown_caught"] or ratio["slowdown_busy_noisy"]) else 1


def _summary(results: dict, args: argparse.Namespace, wall_s: float, seconds: dict,
             out: Path) -> dict:
    reruns = [v for k, v in results.items() if k.startswith("rerun")]
    slowed = next(v for k, v in results.items() if k.startswith("slowed"))
    per_metric = {m: {"rerun_failures": sum(not r[m]["passed"] for r in reruns),
                      "slowdown_caught": not slowed[m]["passed"],
                      # on a busy machine the gate cannot tell the slowdown from the load: it
                      # flags the slowed problems that passed the floor noisy (not same)
                      "slowdown_busy_noisy": bool(slowed[m]["busy"]) and slowed[m]["passed"]
                      and bool(slowed[m]["noisy"]),
                      "rerun_noisy": sum(len(r[m]["noisy"]) for r in reruns),
                      "busy_rows": max((len(r[m]["busy"]) for r in results.values()), default=0),
                      "slowdown_regressed": slowed[m]["regressed"],
                      "slowdown_min_change": slowed[m]["min_change"],
                      "rerun_max_change": max((r[m]["max_change"] or 0) for r in reruns)
                      if reruns else None}
                  for m in METRICS}
    return {"suite": args.suite, "reruns": len(reruns), "slowdown": args.slowdown,
            "cpu_threads": args.cpu_threads, "forked": args.fork,
            "max_regression": args.max_regression, "wall_s": round(wall_s, 1),
            "run_s": {k: round(v, 1) for k, v in seconds.items()}, "out_dir": str(out),
            **per_metric}


def _print(results: dict, summary: dict) -> None:
    def pct(x):
        return "    -" if x is None else f"{x * 100:+5.1f}%"

    # "worst change": the largest change of any problem (of tilewright/ATen, or of ms)
    print(f"{'run':<14}" + "".join(f"{m + ' gate':<14}{'worst change':>12}   " for m in METRICS))
    for name, v in results.items():
        print(f"{name:<14}" + "".join(f"{'PASS' if v[m]['passed'] else 'FAIL':<14}"
                                      f"{pct(v[m]['max_change']):>12}   " for m in METRICS))
    for m in METRICS:
        s = summary[m]
        caught = ("caught" if s["slowdown_caught"] else
                  "flagged noisy (busy machine)" if s["slowdown_busy_noisy"] else "MISSED")
        print(f"{m}: {s['rerun_failures']}/{summary['reruns']} reruns of unchanged code failed "
              f"({s['rerun_noisy']} noisy rows, {s['busy_rows']} rows timed busy); "
              f"the {summary['slowdown']} slowdown was {caught} ({len(s['slowdown_regressed'])} "
              f"problems flagged, smallest change {pct(s['slowdown_min_change']).strip()})")
    print(f"floor {summary['max_regression']}; cpu threads {summary['cpu_threads']}; "
          f"wall time {summary['wall_s']} s; results in {summary['out_dir']}")


if __name__ == "__main__":
    sys.exit(main())
