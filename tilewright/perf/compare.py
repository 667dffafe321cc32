"""``tilewright bench compare``: the regression gate between two results files.

Per problem present in both files, the change of tilewright's median time is
``new / base - 1``. It is a *regression* when it exceeds ``max_regression`` and also exceeds the
measured noise, ``2 x max(spread / median)`` of the two measurements; an *improvement* when it is
below minus both; otherwise *same* (or *noisy* when the threshold was passed but the noise was
larger). Problems missing from the new results fail the gate too, unless allowed: losing coverage
silently is how regressions get through. Results from a different target than the baseline's
are refused: a baseline is only meaningful on its own arch (``bench/baselines/<arch>/``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilewright.errors import TilewrightError
from tilewright.perf.run import FORMAT


class CompareError(TilewrightError):
    """Results that cannot be compared; the message says which file to use instead."""


@dataclass(frozen=True)
class Row:
    """One problem: times in ms, ``change`` and ``noise`` as fractions, speed-ups over ATen."""

    id: str
    verdict: str  # regression, improvement, same, noisy, missing, new, error
    base_ms: float | None = None
    new_ms: float | None = None
    change: float | None = None
    noise: float | None = None
    base_speedup: float | None = None
    new_speedup: float | None = None
    base_choice: str = ""
    new_choice: str = ""


@dataclass
class Comparison:
    """Rows in baseline order (new-only problems last) and the gate's verdict."""

    base_env: dict[str, Any]
    new_env: dict[str, Any]
    max_regression: float
    rows: list[Row] = field(default_factory=list)
    allow_missing: bool = False

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


def _impl(row: dict[str, Any], impl: str) -> tuple[float | None, float | None]:
    m = row.get("impls", {}).get(impl, {})
    return m.get("ms"), m.get("spread_ms")


def compare(base: dict[str, Any], new: dict[str, Any], max_regression: float = 0.03, *,
            impl: str = "tilewright", allow_missing: bool = False) -> Comparison:
    """Compare two results documents (see the module docstring for the rule).

    Raises:
        CompareError: the two were measured on different targets, or are different suites.
    """
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
    cmp = Comparison(base["env"], new["env"], max_regression, allow_missing=allow_missing)
    new_rows = {r["id"]: r for r in new["results"]}
    seen = set()
    for b in base["results"]:
        seen.add(b["id"])
        n = new_rows.get(b["id"])
        bm, bs = _impl(b, impl)
        common = dict(id=b["id"], base_ms=bm, base_speedup=b.get("speedup_vs_aten"),
                      base_choice=b.get("choice", ""))
        if n is None:
            cmp.rows.append(Row(verdict="missing", **common))
            continue
        nm, ns = _impl(n, impl)
        common |= dict(new_ms=nm, new_speedup=n.get("speedup_vs_aten"), new_choice=n.get("choice", ""))
        if not bm or not nm:
            cmp.rows.append(Row(verdict="error" if bm else "new", **common))
            continue
        change = nm / bm - 1
        noise = 2 * max((bs or 0) / bm, (ns or 0) / nm)
        if change > max_regression:
            verdict = "regression" if change > noise else "noisy"
        elif change < -max(max_regression, noise):
            verdict = "improvement"
        else:
            verdict = "same"
        cmp.rows.append(Row(verdict=verdict, change=change, noise=noise, **common))
    for n in new["results"]:
        if n["id"] not in seen:
            nm, _ = _impl(n, impl)
            cmp.rows.append(Row(id=n["id"], verdict="new", new_ms=nm,
                                new_speedup=n.get("speedup_vs_aten"), new_choice=n.get("choice", "")))
    return cmp


def parse_percent(text: str) -> float:
    """"3%" or "3" -> 0.03 (a bare number is a percentage too).

    Raises:
        ValueError: not a number, or negative.
    """
    value = float(text.strip().rstrip("%"))
    if value < 0:
        raise ValueError(f"a regression threshold cannot be negative: {text}")
    return value / 100
