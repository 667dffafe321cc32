"""Shipping and maintaining tuning results: export, import, list and prune the tuning cache.

An export is one file a team can commit beside a model and import on every machine that serves
it: JSON (``.json``) or SQLite (``.sqlite``/``.db``). It holds what the cache holds, per problem
key the key's fields and one record per candidate, i.e. choices and timings, never code: an
import keeps only the known fields of each record and recomputes each problem's digest from its
key, so a bundle cannot smuggle anything else in or file a record under a wrong key.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from tilewright.autotune.candidates import Candidate
from tilewright.autotune.files import check_replaceable, json_object
from tilewright.kinds import problem_from_json
from tilewright.autotune.cache import (FORMAT, ProblemKey, Record, TuningCache, current_versions,
                                       entry_problem, record_problem)
from tilewright.errors import TilewrightError

log = logging.getLogger("tilewright.autotune")
BUNDLE_FORMAT = "tilewright-tuning-bundle/1"
_SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")


class BundleError(TilewrightError):
    """A tuning bundle that cannot be read; the message says what is wrong with it."""


def clean_entry(entry: dict[str, Any], where: str = "") -> tuple[str, dict[str, Any]] | None:
    """(digest, entry) rebuilt from the entry's key fields and its valid records' known fields
    only, or None when the entry itself is unusable or has no valid record. Each record or entry left out is named in
    a warning (``where`` says which file it came from)."""
    why = entry_problem(entry)
    if why:
        log.warning("%sskipped a problem entry: %s", where, why)
        return None
    key = ProblemKey.from_entry(entry)
    records = {}
    for ck, r in entry["records"].items():
        bad = record_problem(r)
        if bad:
            log.warning("%sskipped record %s of %s: %s", where, ck, key.problem.describe(), bad)
            continue
        records[str(ck)] = Record.from_json(r).to_json()
    if not records:
        return None  # nothing left to bring in: no empty problem either
    return key.digest, {**key.to_json(), "records": records}


def _is_sqlite(path: Path) -> bool:
    if path.suffix in _SQLITE_SUFFIXES:
        return True
    try:
        with open(path, "rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def _is_bundle(raw: bytes) -> bool:
    """Whether bytes are an exported bundle (JSON or SQLite): what an export may replace. A
    tuning cache is not one: exporting over it would destroy it."""
    if raw.startswith(b"SQLite format 3\x00"):
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".sqlite") as f:
            f.write(raw)
            f.flush()
            try:
                with sqlite3.connect(f"file:{f.name}?mode=ro", uri=True) as db:
                    fmt = json.loads(dict(db.execute("SELECT key, value FROM meta"))["format"])
                db.close()
            except (sqlite3.Error, KeyError, json.JSONDecodeError):
                return False
        return fmt == BUNDLE_FORMAT
    data = json_object(raw)
    return data is not None and data.get("format") == BUNDLE_FORMAT


def write_bundle(path: Path | str, problems: dict[str, dict[str, Any]]) -> None:
    """Write ``problems`` (digest -> entry) to ``path``, SQLite when its suffix says so.

    Raises:
        OutputFileError: ``path`` exists and is not a tuning bundle (a tuning cache included):
            it is left as it is.
    """
    path = Path(path)
    check_replaceable(path, _is_bundle, "a tuning bundle")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": BUNDLE_FORMAT, "created": time.time(), "exported_by": current_versions()}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    if path.suffix in _SQLITE_SUFFIXES:
        with sqlite3.connect(tmp) as db:
            db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
            db.execute("CREATE TABLE problems (digest TEXT PRIMARY KEY, key_json TEXT NOT NULL)")
            db.execute("CREATE TABLE records (digest TEXT, candidate TEXT, record_json TEXT, "
                       "PRIMARY KEY (digest, candidate))")
            db.executemany("INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in meta.items()])
            for digest, entry in problems.items():
                key = {k: v for k, v in entry.items() if k != "records"}
                db.execute("INSERT INTO problems VALUES (?, ?)", (digest, json.dumps(key, sort_keys=True)))
                db.executemany("INSERT INTO records VALUES (?, ?, ?)",
                               [(digest, ck, json.dumps(r, sort_keys=True))
                                for ck, r in entry["records"].items()])
        db.close()
    else:
        tmp.write_text(json.dumps({**meta, "problems": problems}, indent=1, sort_keys=True))
    tmp.replace(path)


def read_bundle(path: Path | str) -> dict[str, dict[str, Any]]:
    """The cleaned entries of a bundle (JSON or SQLite) or of a tuning cache file.

    Raises:
        BundleError: the file is missing, not a bundle, or has an entry that does not parse.
    """
    path = Path(path)
    if not path.is_file():
        raise BundleError(f"no tuning bundle at {path}; give the file `tilewright cache export` wrote")
    raw: dict[str, Any] = {}
    try:
        if _is_sqlite(path):
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                fmt = json.loads(dict(db.execute("SELECT key, value FROM meta"))["format"])
                if fmt != BUNDLE_FORMAT:
                    raise BundleError(f"{path} is a {fmt} file, not a {BUNDLE_FORMAT} bundle")
                for digest, key_json in db.execute("SELECT digest, key_json FROM problems"):
                    raw[digest] = {**json.loads(key_json), "records": {}}
                for digest, ck, rec in db.execute("SELECT digest, candidate, record_json FROM records"):
                    raw.setdefault(digest, {"records": {}})["records"][ck] = json.loads(rec)
            db.close()
        else:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or data.get("format") not in (BUNDLE_FORMAT, FORMAT):
                raise BundleError(f"{path} is not a tuning bundle (format {BUNDLE_FORMAT}) "
                                  f"nor a tuning cache ({FORMAT})")
            raw = data["problems"]
    except (sqlite3.Error, json.JSONDecodeError, UnicodeDecodeError, KeyError) as e:
        raise BundleError(f"{path} does not read as a tuning bundle ({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict):
        raise BundleError(f"{path} holds no problems object; export it again with `tilewright cache export`")
    cleaned = (clean_entry(entry, f"{path}: ") for entry in raw.values())
    return dict(c for c in cleaned if c is not None)


def export_cache(cache: TuningCache, dest: Path | str, *, target: str | None = None,
                 current_only: bool = False) -> int:
    """Write the cache's entries (optionally one target's, optionally only records valid for
    the installed versions and templates) to ``dest``. Returns the number of records written."""
    out: dict[str, dict[str, Any]] = {}
    for _, entry in cache.entries():
        if target is not None and entry.get("target") != target:
            continue
        if current_only and not is_current_entry(entry):
            continue
        digest, clean = clean_entry(entry)  # entries() yields only valid ones
        if current_only:
            clean["records"] = {ck: r for ck, r in clean["records"].items() if not is_stale_record(r)}
        if clean["records"]:
            out[digest] = clean
    write_bundle(dest, out)
    return sum(len(e["records"]) for e in out.values())


def import_bundle(cache: TuningCache, src: Path | str) -> int:
    """Merge a bundle into the cache (a record already there is kept when it is newer).
    Returns the number of records written."""
    return cache.merge(read_bundle(src))


def is_current_entry(entry: dict[str, Any]) -> bool:
    """Whether an entry's versions are the installed torch, triton and tilewright."""
    v = current_versions()
    return (entry.get("torch_version"), entry.get("triton_version"),
            entry.get("tilewright_version")) == (v["torch"], v["triton"], v["tilewright"])


def is_stale_record(record: dict[str, Any]) -> bool:
    """Whether a record was measured for a template source that is no longer installed."""
    from tilewright.templates import get_template

    try:
        return get_template(record["template_id"]).source_hash != record["template_hash"]
    except KeyError:
        return True


@dataclass(frozen=True)
class PruneReport:
    """Records removed, by reason (``invalid``: records and problem entries that did not
    validate, always removed)."""

    stale_templates: int = 0
    failures: int = 0
    other_versions: int = 0
    older: int = 0
    invalid: int = 0

    @property
    def total(self) -> int:
        return self.stale_templates + self.failures + self.other_versions + self.older + self.invalid


def prune(cache: TuningCache, *, stale_templates: bool = False, failures: bool = False,
          other_versions: bool = False, older_than_days: float | None = None) -> PruneReport:
    """Remove records: of template sources no longer installed, of failed/wrong candidates (to
    retry them, e.g. after a driver update), of other torch/triton/tilewright versions, or
    older than ``older_than_days``. Records and entries that do not validate always go;
    problems left without records go too."""
    counts = {"stale_templates": 0, "failures": 0, "other_versions": 0, "older": 0}
    cutoff = time.time() - older_than_days * 86400 if older_than_days is not None else None

    def keep(entry: dict[str, Any], ck: str, rec: dict[str, Any]) -> bool:
        why = None
        if other_versions and not is_current_entry(entry):
            why = "other_versions"
        elif stale_templates and is_stale_record(rec):
            why = "stale_templates"
        elif failures and rec.get("status") in ("failed", "wrong"):
            why = "failures"
        elif cutoff is not None and rec.get("created", 0) < cutoff:
            why = "older"
        if why:
            counts[why] += 1
        return why is None

    _, invalid = cache.rewrite(keep)
    return PruneReport(**counts, invalid=invalid)


@dataclass(frozen=True)
class ClearReport:
    """What :func:`clear` removed (or, dry, would remove): tuning records (invalid ones
    included), generated kernel modules and warm progress files; ``kept``: files found beside
    them that tilewright did not write, left in place."""

    records: int = 0
    kernel_modules: int = 0
    warm_states: int = 0
    kept: tuple[str, ...] = ()


def clear(cache: TuningCache, *, kernels_root: Path | None = None, dry_run: bool = False) -> ClearReport:
    """Empty the tuning cache and remove what tilewright generated beside it, and only that.

    The tuning file stays (an empty tuning cache: a link stays a link, a lock stays beside it);
    a file that is not a tuning cache never gets here (``TuningCache`` refuses it). Kernel
    modules go only where the loader wrote them byte for byte
    (:func:`tilewright.runtime.loader.owned_kernel_modules`), warm progress files only where they
    read as one (``<cache dir>/warm/*.json``); anything else is kept and named. ``kernels_root``:
    the kernel modules' folder (None: leave kernel modules alone). ``dry_run``: count only.
    """
    from tilewright.autotune.warm import WarmState
    from tilewright.runtime.loader import owned_kernel_modules

    problems = cache._snapshot()["problems"] if cache.path.exists() else {}
    records = sum(len(e.get("records", {})) if isinstance(e, dict) and isinstance(e.get("records"), dict) else 1
                  for e in problems.values())
    modules = owned_kernel_modules(kernels_root) if kernels_root is not None and kernels_root.is_dir() else []
    warm_dir = cache.path.parent / "warm"
    states, kept = [], []
    if warm_dir.is_dir():
        for path in sorted(warm_dir.iterdir()):
            try:
                ours = path.is_file() and not path.is_symlink() and WarmState.is_state(path.read_bytes())
            except OSError:
                ours = False
            (states if ours else kept).append(path)
    if kernels_root is not None and kernels_root.is_dir():
        owned = set(modules)
        kept += [p for p in sorted(kernels_root.rglob("*")) if p.is_file() and p not in owned]
    if not dry_run:
        if records:
            removed, invalid = cache.rewrite(lambda entry, ck, rec: False)
            records = removed + invalid
        for path in modules + states:
            path.unlink(missing_ok=True)
        for folder in sorted({p.parent for p in modules} | ({warm_dir} if states else set())):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when nothing else is left in it
    return ClearReport(records, len(modules), len(states), tuple(str(p) for p in kept))


def entry_rows(entries: Iterable[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One summary row per problem: digest, problem text, target, versions, record counts by
    status and the fastest checked candidate (ms)."""
    rows = []
    for digest, entry in entries:
        problem = problem_from_json(entry["problem"])
        recs = entry.get("records", {})
        ok = [(r["median_ms"], ck, r) for ck, r in recs.items()
              if r.get("status") in ("ok", "aborted") and r.get("median_ms") is not None]
        fastest = min(ok, key=lambda t: t[:2]) if ok else None
        status: dict[str, int] = {}
        for r in recs.values():
            status[r.get("status", "?")] = status.get(r.get("status", "?"), 0) + 1
        rows.append({
            "digest": digest, "problem": problem.describe(), "target": entry["target"],
            "versions": f"torch {entry['torch_version']} triton {entry['triton_version']} "
                        f"tilewright {entry['tilewright_version']}",
            "records": len(recs), "status": status, "current": is_current_entry(entry),
            "fastest": (Candidate.of(fastest[2]["template_id"], "", fastest[2].get("params")).name
                        if fastest else None),
            "fastest_ms": fastest[0] if fastest else None,
        })
    return rows
