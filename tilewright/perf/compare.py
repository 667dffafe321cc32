"""``tilewright bench compare``: the regression gate between two results files.

Two metrics, per problem present in both files:

* ``ratio`` (the default): tilewright's time over ATen's, measured side by side in the same run
  (``paired_vs_aten`` of ``bench run``). The change is ``new_ratio / base_ratio - 1``. Whatever
  slows the whole machine between the two runs (another job on a shared host, clocks, a noisy
  neighbour) slows ATen alike and cancels; what is left is tilewright against ATen. The noise
  it is weighed against is ``noise_k x`` the combined standard error of the two ratios (each
  from the spread of its per-round ratios), so a run with few or scattered pairs needs a larger
  change to fail.
* ``absolute``: tilewright's median time, ``new / base - 1``, against ``2 x max(spread /
  median)`` of the two measurements. It also catches ATen (torch) getting slower, but only a
  quiet machine (a dedicated GPU) keeps run-to-run drift below the threshold.

Model suites (``cpu``, ``cpu-ci``) time two tilewright sides: the default one (the graph race
on: a compiled CPU graph that loses to eager's ops runs eager's ops) and the generated graph
itself (``tilewright_race_off``, ``race_off_paired_vs_aten``). The gate judges the race-off
side wherever both files have it: with the race on, a generated kernel that got slower and
then lost the race would read as "about eager" and pass. Each row says which side it judged.

A model-suite row timed on a busy machine (:mod:`tilewright.perf.load`: its timed thread ran
less than 85% of the wall time, or the load average was above one per CPU) in either file is
also weighed against :data:`~tilewright.perf.load.BUSY_NOISE`: the ratio of unchanged code
moves by that much between a quiet and a busy run, which no within-run standard error shows.
Such a change reads ``noisy``; a larger one still fails. Quiet against quiet, the standard
errors alone set the noise, so a 10% regression fails.

Either way a change is a *regression* when it exceeds ``max_regression`` (the floor) and also
the noise, i.e. ``change > max(max_regression, noise)``; an *improvement* when below minus
both; otherwise *same* (or *noisy* when it passed the floor but not the noise). A problem
without an ATen time in either file falls back to ``absolute``; each row says which metric and
threshold it used. Problems missing from the new results fail the gate too, unless allowed:
losing coverage silently is how regressions get through. Results from a different target than
the baseline's are refused: a baseline is only meaningful on its own arch
(``bench/baselines/<arch>/``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilewright.errors import TilewrightError
from tilewright.perf.load import BUSY_NOISE, row_busy
from tilewright.perf.run import FORMAT


class CompareError(TilewrightError):
    """Results that cannot be compared; the message says which file to use instead."""


METRICS = ("ratio", "absolute")
DEFAULT_MAX_REGRESSION = 0.05  # the floor; bench/gate_noise.py: unchanged code stays under it
# ratio metric: a change must exceed 3 combined standard errors (~0.1% of unchanged problems
# if the errors were Gaussian; the floor covers the ways they are not)
NOISE_K = 3.0
ABSOLUTE_NOISE = 2.0  # absolute metric: twice the larger relative spread (the gate's old rule)


@dataclass(frozen=True)
class Row:
    """One problem. ``base``/``new`` are the figure compared: tilewright ms / ATen ms for the
    ratio metric, tilewright ms for absolute. ``change``, ``noise`` and ``threshold`` (the
    change above which it is a regression) are fractions; times in ms; speed-ups over ATen."""

    id: str
    verdict: str  # regression, improvement, same, noisy, missing, new, error
    metric: str = ""  # "ratio", "ratio (unpaired)", "absolute", "absolute (no ATen time)"
    base: float | None = None
    new: float | None = None
    change: float | None = None
    noise: float | None = None
    threshold: float | None = None
    base_ms: float | None = None
    new_ms: float | None = None
    base_speedup: float | None = None
    new_speedup: float | None = None
    base_choice: str = ""
    new_choice: str = ""
    side: str = ""  # model suites: "race off" (the generated graph) or "default" (race on)
    busy: bool = False  # either run timed this row on a busy machine (perf.load)

    @property
    def threshold_source(self) -> str:
        """What set the threshold: ``floor`` (max_regression), ``noise`` or ``busy`` (the busy
        machine's allowance); "" without one."""
        if self.threshold is None or self.noise is None:
            return ""
        if self.noise < self.threshold:
            return "floor"
        return "busy" if self.busy and self.noise == BUSY_NOISE else "noise"


@dataclass
class Comparison:
    """Rows in baseline order (new-only problems last) and the gate's verdict."""

    base_env: dict[str, Any]
    new_env: dict[str, Any]
    max_regression: float
    metric: str = "ratio"
    noise_k: float = NOISE_K
    rows: list[Row] = field(default_factory=list)
    allow_missing: bool = False
    injected: dict[str, float] = field(default_factory=dict)  # "baseline"/"new" -> fraction

    def count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.rows)

    @property
    def passed(self) -> bool:
        bad = self.count("regression") + self.count("error")
        return bad == 0 and (self.allow_missing or self.count("missing") == 0)

    def geomean_speedup(self, which: str) -> float | None:
        vals = [getattr(r, f"{which}_speedup") for r in self.rows]
        vals = [v for v in vals if v]
        return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None

    def rule(self) -> str:
        """The gate's rule in words, for reports."""
        if self.metric == "ratio":
            return (f"metric ratio (tilewright ms / ATen ms, timed side by side in each run); "
                    f"regression when the ratio grew by more than max({self.max_regression:.1%}, "
                    f"{self.noise_k:g} x combined standard error)"
                    + (f"; model suites: the race-off side, and a row timed on a busy machine in "
                       f"either run within {BUSY_NOISE:.0%} is noisy" if any(r.side for r in self.rows) else ""))
        return (f"metric absolute (tilewright ms); regression when it grew by more than "
                f"max({self.max_regression:.1%}, {ABSOLUTE_NOISE:g} x the larger relative spread)")


def load_results(path: Path | str, suite: str | None = None, arch: str | None = None) -> dict[str, Any]:
    """A results file; a folder is taken as a baselines folder holding ``<arch>/<suite>.json``.

    Raises:
        CompareError: missing or malformed file, or a folder without that baseline.
    """
    path = Path(path)
    if path.is_dir():
        if not (suite and arch):
            raise CompareError(f"{path} is a folder: give a results file")
        candidate = path / arch / f"{suite}.json"
        if not candidate.is_file():
            raise CompareError(f"no baseline for suite {suite!r} on {arch} at {candidate}; record "
                               f"one with: tilewright bench run --suite {suite} --out {candidate}")
        path = candidate
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise CompareError(f"no results file at {path}; write one with tilewright bench run") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CompareError(f"{path} is not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "results" not in doc:
        raise CompareError(f"{path} is not a {FORMAT} results file (tilewright bench run --out)")
    return doc


RACE_OFF = "tilewright_race_off"  # perf.cpu_suite's name of the race-off side


def _impl(row: dict[str, Any], impl: str) -> tuple[float | None, float | None]:
    m = row.get("impls", {}).get(impl, {})
    return m.get("ms"), m.get("spread_ms")


def _side(b: dict[str, Any], n: dict[str, Any] | None) -> tuple[str, str]:
    """(field prefix, side label) the gate judges for a baseline row and a new one: the
    race-off side when both have it, else the default one ("" label outside model suites)."""
    if n is not None and all(r.get("race_off_paired_vs_aten") or _impl(r, RACE_OFF)[0] for r in (b, n)):
        return "race_off_", "race off"
    if any(RACE_OFF in r.get("impls", {}) for r in (b, n) if r is not None):
        return "", "race on (one file has no race-off time)"
    return "", ""


def _ratio(row: dict[str, Any], prefix: str = "") -> tuple[float, float, bool] | None:
    """(tilewright / ATen, its relative uncertainty, paired?) of a results row, or None when
    it has no ATen time. Rows from before paired timing get the ratio of the two medians,
    weighed with their relative spreads combined (a spread, not a standard error: cautious).
    ``prefix`` "race_off_" reads the race-off side of a model-suite row."""
    paired = row.get(f"{prefix}paired_vs_aten") or {}
    if paired.get("ratio"):
        return paired["ratio"], paired.get("stderr", 0.0) / paired["ratio"], True
    (tm, ts), (am, as_) = _impl(row, RACE_OFF if prefix else "tilewright"), _impl(row, "aten")
    if not (tm and am):
        return None
    return tm / am, math.hypot((ts or 0) / tm, (as_ or 0) / am), False


def _verdict(change: float, floor: float, noise: float) -> str:
    if change > floor:
        return "regression" if change > noise else "noisy"
    if change < -max(floor, noise):
        return "improvement"
    return "same"


def _judge_ratio(b: dict[str, Any], n: dict[str, Any], floor: float, noise_k: float,
                 prefix: str = "", busy: bool = False) -> dict | None:
    """The ratio metric's fields for a row, or None when either run lacks an ATen time."""
    br, nr = _ratio(b, prefix), _ratio(n, prefix)
    if br is None or nr is None:
        return None
    change = nr[0] / br[0] - 1
    noise = noise_k * math.hypot(br[1], nr[1])
    if busy:
        noise = max(noise, BUSY_NOISE)
    return dict(metric="ratio" if br[2] and nr[2] else "ratio (unpaired)", base=br[0],
                new=nr[0], change=change, noise=noise, threshold=max(floor, noise),
                verdict=_verdict(change, floor, noise))


def _judge_absolute(bm: float, bs: float | None, nm: float, ns: float | None,
                    floor: float, busy: bool = False) -> dict:
    change = nm / bm - 1
    noise = ABSOLUTE_NOISE * max((bs or 0) / bm, (ns or 0) / nm)
    if busy:
        noise = max(noise, BUSY_NOISE)
    return dict(metric="absolute", base=bm, new=nm, change=change, noise=noise,
                threshold=max(floor, noise), verdict=_verdict(change, floor, noise))


def _check_comparable(base: dict[str, Any], new: dict[str, Any]) -> None:
    for doc, which in ((base, "baseline"), (new, "new results")):
        if not isinstance(doc.get("env"), dict) or not isinstance(doc.get("results"), list):
            raise CompareError(f"the {which} is not a `tilewright bench run` results file "
                               "(it needs 'env' and 'results')")
    if base.get("suite") and new.get("suite") and base["suite"] != new["suite"]:
        raise CompareError(f"the baseline is suite {base['suite']!r} but the new results are "
                           f"{new['suite']!r}: compare runs of the same suite")
    bt, nt = base["env"]["target"], new["env"]["target"]
    if bt != nt:
        raise CompareError(
            f"the baseline was recorded on {bt} ({base['env'].get('device', '?')}) but the new "
            f"results on {nt} ({new['env'].get('device', '?')}); compare against a baseline of "
            f"the same arch: bench/baselines/{new['env'].get('arch', nt)}/{new.get('suite', 'SUITE')}.json")


def compare(base: dict[str, Any], new: dict[str, Any],
            max_regression: float = DEFAULT_MAX_REGRESSION, *,
            metric: str = "ratio", noise_k: float = NOISE_K, impl: str = "tilewright",
            allow_missing: bool = False) -> Comparison:
    """Compare two results documents (see the module docstring for the rule).

    Args:
        max_regression: the floor, a fraction (0.05: a change under 5% never fails).
        metric: ``ratio`` (tilewright / ATen, paired in each run) or ``absolute`` (ms).
        noise_k: how many combined standard errors a ratio change must exceed.
        impl: whose times the absolute metric compares.

    Raises:
        CompareError: an unknown metric, the two were measured on different targets, or are
            different suites.
    """
    if metric not in METRICS:
        raise CompareError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}")
    _check_comparable(base, new)
    cmp = Comparison(base["env"], new["env"], max_regression, metric, noise_k,
                     allow_missing=allow_missing, injected=_injected(base, new))
    new_rows = {r["id"]: r for r in new["results"]}
    seen = set()
    for b in base["results"]:
        seen.add(b["id"])
        cmp.rows.append(_row(b, new_rows.get(b["id"]), cmp, impl))
    for n in new["results"]:
        if n["id"] not in seen:
            nm, _ = _impl(n, impl)
            cmp.rows.append(Row(id=n["id"], verdict="new", new_ms=nm,
                                new_speedup=n.get("speedup_vs_aten"), new_choice=n.get("choice", "")))
    return cmp


def _row(b: dict[str, Any], n: dict[str, Any] | None, cmp: Comparison, impl: str) -> Row:
    prefix, side = _side(b, n)
    if prefix and impl == "tilewright":
        impl = RACE_OFF
    bm, bs = _impl(b, impl)
    common: dict[str, Any] = dict(id=b["id"], base_ms=bm, base_speedup=b.get(f"{prefix}speedup_vs_aten"),
                                  base_choice=b.get("choice", ""), side=side)
    if n is None:
        return Row(verdict="missing", **common)
    nm, ns = _impl(n, impl)
    busy = bool(row_busy(b) or row_busy(n))
    common |= dict(new_ms=nm, new_speedup=n.get(f"{prefix}speedup_vs_aten"),
                   new_choice=n.get("choice", ""), busy=busy)
    if not bm or not nm:
        return Row(verdict="error" if bm else "new", **common)
    judged = (_judge_ratio(b, n, cmp.max_regression, cmp.noise_k, prefix, busy)
              if cmp.metric == "ratio" else None)
    if judged is None:
        judged = _judge_absolute(bm, bs, nm, ns, cmp.max_regression, busy)
        if cmp.metric == "ratio":  # say so: this row could not cancel machine drift
            judged["metric"] = "absolute (no ATen time)"
    if busy:
        judged["metric"] += ", busy machine"
    return Row(**judged, **common)


def _injected(base: dict[str, Any], new: dict[str, Any]) -> dict[str, float]:
    """Slowdowns injected by ``bench run --inject-slowdown`` (test runs), by which file."""
    out = {}
    for doc, which in ((base, "baseline"), (new, "new")):
        fraction = (doc.get("settings") or {}).get("inject_slowdown") or 0.0
        if fraction:
            out[which] = fraction
    return out


def parse_percent(text: str) -> float:
    """"3%" or "3" -> 0.03 (a bare number is a percentage too).

    Raises:
        ValueError: not a number, or negative.
    """
    value = float(text.strip().rstrip("%"))
    if value < 0:
        raise ValueError(f"a regression threshold cannot be negative: {text}")
    return value / 100
