"""bench/device_check.sh's report: merges what its parts wrote into one JSON, keeps each bench
suite's results as the next run's baseline, gates them against the committed baseline, and
prints one table.

usage: python bench/device_report.py WORK OUT [--quiet] [--gate] [--seconds S]
  WORK: the parts' raw files (env.json, parts.jsonl, NAME.json, gpu_tests.xml, NAME.log)
  OUT:  receives check.json (rewritten on every call), baselines/<arch>/<suite>.json (the bench
        suites' results, to commit as bench/baselines/<arch>/<suite>.json), and with --gate
        table.txt (the table as printed)
  --gate: compare each bench suite with bench/baselines/<arch>/<suite>.json where it exists
        (tilewright bench compare's ratio metric), print the table, exit 1 when a part or a
        gate failed
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def is_bench(data: Any) -> bool:
    """Whether a part wrote a ``tilewright bench run`` results file (any suite): those are gated
    against bench/baselines/<arch>/<suite>.json and kept as the next baseline."""
    return isinstance(data, dict) and isinstance(data.get("results"), list) and "suite" in data \
        and isinstance(data.get("env"), dict) and "arch" in data["env"]


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float)) and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _tests(work: Path) -> dict[str, int]:
    """pytest's counts: from the JUnit file, or (a run killed at its limit writes none) from
    the -rA summary lines of its log."""
    try:
        suite = ET.parse(work / "gpu_tests.xml").getroot()
        suite = suite if suite.tag == "testsuite" else suite[0]
        t = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        return {"passed": t["tests"] - t["failures"] - t["errors"] - t["skipped"], "failed": t["failures"],
                "errors": t["errors"], "skipped": t["skipped"]}
    except (OSError, ET.ParseError, IndexError):
        pass
    try:
        log = (work / "gpu_tests.log").read_text(errors="replace")
    except OSError:
        return {}
    counts = {k: len(re.findall(rf"^{k.upper()} ", log, re.M)) for k in ("passed", "failed", "skipped")}
    counts["errors"] = len(re.findall(r"^ERROR ", log, re.M))
    return counts | {"cut_short": True}


def summarise(name: str, data: Any, work: Path) -> tuple[str, str]:
    """(headline, detail) of one part's results for the table."""
    if name == "gpu_tests":
        t = _tests(work)
        if not t:
            return "-", ""
        head = f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped"
        return head + (f", {t['errors']} errors" if t.get("errors") else ""), \
            "cut short at its limit" if t.get("cut_short") else ""
    if data is None:
        return "-", "no results written"
    if isinstance(data, dict) and data.get("skipped") and not data.get("rows"):
        return "skipped", str(data["skipped"])
    if is_bench(data):
        rows = data.get("results", [])
        ok = [r for r in rows if not r.get("error")]
        sp_aten = _geomean([r.get("speedup_vs_aten") for r in ok])
        sp_ind = _geomean([(r["impls"].get("inductor", {}).get("ms") or 0) / r["impls"]["tilewright"]["ms"]
                           for r in ok if (r.get("impls", {}).get("tilewright") or {}).get("ms")])
        head = f"{len(ok)}/{len(rows) + len(data.get('skipped', []))} problems"
        detail = f"geomean vs ATen {sp_aten:.2f}x" if sp_aten else ""
        if sp_ind:
            detail += f", vs Inductor max-autotune {sp_ind:.2f}x"
        errors = len(rows) - len(ok)
        return head, detail + (f", {errors} errors" if errors else "")
    if name == "attention":
        rows = data.get("rows", [])
        ok = [r for r in rows if r.get("status") == "ok"]
        sp = _geomean([r.get("speedup") for r in ok])
        bad = [r["row"] for r in rows if r.get("status") in ("wrong", "failed")]
        others = ", ".join(f"{sum(r.get('status') == k for r in rows)} {k}" for k in ("refused", "skipped")
                           if any(r.get("status") == k for r in rows))
        return f"{len(ok)}/{len(rows)} rows ok" + (f" ({others})" if others else ""), \
            (f"geomean vs ATen {sp:.2f}x" if sp else "") + \
            (f"; wrong/failed: {', '.join(sorted(set(bad)))}" if bad else "")
    if name == "llama_decode":
        rows = {r["backend"]: r for r in data.get("rows", [])}
        tw, ind = rows.get("tilewright", {}), rows.get("inductor", {})
        if tw.get("status") != "ok":
            return tw.get("status", "-"), tw.get("reason", "")
        head = f"{tw['ms']:.3f} ms, {tw.get('launches')} launches"
        if ind.get("status") == "ok":
            return head, f"Inductor {ind['ms']:.3f} ms, {ind.get('launches')} launches"
        return head, f"Inductor {ind.get('status', '-')}: {ind.get('reason', '')}"
    if name == "helion":
        rows = data.get("rows", data) if isinstance(data, dict) else data
        done = [r for r in rows if isinstance(r, dict) and r.get("winner")]
        ran = [r for r in done if "helion" in r.get("ms", {})]
        if done and not ran:  # installed, but every Helion template refused (check.log says why)
            return f"{len(done)} problems", "no Helion candidate ran (Helion could not bind: see check.log)"
        return f"{len(done)} problems, Helion ran in {len(ran)}", \
            ", ".join(f"{r['problem']}: {r['winner'].split('[')[0]}" for r in done)[:100]
    return "done", ""


# the kernel languages an NVIDIA run can use, and why one that is missing is not carried
CUDA_LANGUAGES = ("triton", "gluon", "cutedsl", "helion")
NOT_CARRIED = {"cutedsl": "not carried (bench/prepare_wheels.sh): its CUDA library wheel, "
                          "nvidia-cutlass-dsl-libs-cu13, is 88 MiB, over the 64 MiB the tree may take"}


def languages() -> dict[str, str | None]:
    """Each CUDA kernel language's unavailability reason here (None: available)."""
    try:
        from tilewright.runtime.languages import languages as all_languages

        found = {lang.name: lang.check() for lang in all_languages() if lang.name in CUDA_LANGUAGES}
    except Exception as e:  # noqa: BLE001 - the report goes on without this row
        return {"?": f"{type(e).__name__}: {e}"[:200]}
    return {k: (f"{why}; {NOT_CARRIED[k]}" if why and k in NOT_CARRIED else why) for k, why in found.items()}


def gate(doc: dict, out: Path) -> list[dict]:
    """Compare each bench part with its committed baseline; one entry per part."""
    from tilewright.perf.compare import DEFAULT_MAX_REGRESSION, CompareError, compare, load_results

    verdicts = []
    for name, part in doc["parts"].items():
        new = part.get("results")
        if not is_bench(new) or not new["results"]:
            continue
        arch, suite = new["env"].get("arch"), new.get("suite")
        base_path = REPO / "bench" / "baselines" / arch / f"{suite}.json"
        if not base_path.exists():
            verdicts.append({"part": name, "verdict": "no baseline",
                             "detail": f"commit OUT/baselines/{arch}/{suite}.json as bench/baselines/{arch}/"})
            continue
        try:
            # a run cut short by its budget times fewer problems: those are not regressions
            cmp = compare(load_results(base_path), new, DEFAULT_MAX_REGRESSION, allow_missing=True)
        except CompareError as e:
            verdicts.append({"part": name, "verdict": "error", "detail": str(e)[:200]})
            continue
        counts = ", ".join(f"{v} {cmp.count(v)}" for v in ("regression", "error", "improvement", "same", "noisy")
                           if cmp.count(v))
        verdicts.append({"part": name, "verdict": "pass" if cmp.passed else "FAIL", "detail": counts})
    return verdicts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--gate", action="store_true")
    ap.add_argument("--seconds", type=int)
    args = ap.parse_args()
    work, out = args.work, args.out
    runs = [json.loads(line) for line in (work / "parts.jsonl").read_text().splitlines() if line.strip()] \
        if (work / "parts.jsonl").exists() else []
    doc: dict[str, Any] = {"env": _load(work / "env.json"), "seconds": args.seconds, "parts": {}}
    for run in runs:
        name = run["part"]
        doc["parts"][name] = run | {"results": _load(work / f"{name}.json")}
        if name == "gpu_tests":
            doc["parts"][name]["tests"] = _tests(work)
        res = doc["parts"][name]["results"]
        if is_bench(res) and res["results"]:
            dest = out / "baselines" / res["env"]["arch"] / f"{res['suite']}.json"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / f"{name}.json", dest)
    if args.gate:
        doc["gate"] = gate(doc, out)
        doc["languages"] = languages()
    (out / "check.json").write_text(json.dumps(doc, indent=1))
    if args.quiet:
        return 0

    from rich.console import Console
    from rich.table import Table

    env = doc["env"] or {}
    table = Table(title=f"device check: {env.get('device', '?')} ({env.get('arch', '?')}), torch "
                        f"{env.get('torch', '?')}, triton {env.get('triton', '?')}, {args.seconds} s")
    for col in ("part", "status", "s / limit", "result", "detail"):
        table.add_column(col, overflow="fold")
    failed = False
    for name, part in doc["parts"].items():
        rc = part["rc"]
        status = {0: "ok", 124: "TIMEOUT", 137: "KILLED"}.get(rc, f"FAILED ({rc})")
        failed |= rc != 0
        if part.get("skipped"):
            table.add_row(name, "skipped", "", "", part["skipped"])
            continue
        head, detail = summarise(name, part["results"], work)
        table.add_row(name, status, f"{part['seconds']} / {part['limit_s']}", head, detail)
    for lang, why in doc.get("languages", {}).items():
        if why:  # a missing language is a skipped part of the check, not a failure
            table.add_row(f"language {lang}", "skipped", "", "", why)
    for g in doc.get("gate", []):
        failed |= g["verdict"] in ("FAIL", "error")
        table.add_row(f"gate {g['part']}", g["verdict"], "", "", g["detail"])
    with (out / "table.txt").open("w") as f:
        Console(file=f, width=140).print(table)
    print(f"device_check: {'FAILED' if failed else 'passed'}; results in {out}/check.json, logs in "
          f"{out}/check.log; baselines to commit under {out}/baselines/", flush=True)
    Console(width=140).print(table)  # last: what a person reads
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
