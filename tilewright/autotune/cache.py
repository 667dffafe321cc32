"""The persistent tuning cache: measured results per (problem key, candidate), never code.

One JSON file (``<cache_dir>/autotune/tuning.json``) holds, per problem key, one record per
candidate tried: its status, median time and spread, and error against the reference, and the
decision: the candidate every process uses for that problem. Adding a template or a parameter
setting adds records and invalidates none; a template whose source changed has a new hash, so
only its own records stop matching (``prune`` removes them).

Processes share the file safely: writers take a ``filelock``, re-read the file, merge their
records in and replace the file atomically, so two writers racing lose nothing; readers never
see half a file. The first process to decide a problem records its decision and the others adopt
it (:meth:`TuningCache.store`), so the ranks of one job run the same kernel.

What the cache never does to a user's file: a file that is not a tuning cache (a README, an
exported bundle, a newer format) is refused with :class:`~tilewright.errors.CacheFileError` and
left as it is; only a file that is a damaged tuning cache (it starts as one, then does not
parse) is moved aside (``tuning.json.corrupt-<time>``) and rebuilt, and a read-only cache (``cache
list``/``export``) does not even do that. A record that does not validate (a missing field, a
string time, NaN) is a miss, reported once, and ``cache prune`` removes it.

The cache of a compiled model is lenient (``strict=False``): a refused or unwritable file costs
the persistence, not the model. Tuning goes on with an in-memory cache, after one warning.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import filelock

from tilewright.autotune.files import special_file_reason
from tilewright.errors import CacheFileError

log = logging.getLogger("tilewright.autotune")
FORMAT = "tilewright-tuning/1"
_FORMAT_FAMILY = "tilewright-tuning/"
_BUNDLE_FAMILY = "tilewright-tuning-bundle/"


# the modules that decide a candidate's verdict and its time, as paths in the package: its inputs,
# the checks (evaluate.py: special values, the reference comparison; kinds/: each problem kind's
# error and tolerance), and the timing method. A record measured under other rules is not reused
# (the digest is in the key).
# (a folder: every module in it; a pattern: every file it matches, so each kind's folder's checks,
# a new kind's too, count)
CHECK_RULES = ("kinds/*/checks.py", "autotune/kinds.py", "autotune/bench.py", "autotune/evaluate.py", "kinds")


def check_rule_files() -> list[Path]:
    """The source files of :data:`CHECK_RULES`, in digest order."""
    package = Path(__file__).parent.parent
    files: list[Path] = []
    for name in CHECK_RULES:
        path = package / name
        if "*" in name:
            files += sorted(package.glob(name))
        else:
            files += sorted(path.glob("*.py")) if path.is_dir() else [path]
    return files


@functools.lru_cache(maxsize=1)
def check_rules_digest() -> str:
    """A digest of the checking and timing rules' source (:data:`CHECK_RULES`)."""
    h = hashlib.sha256()
    for module in check_rule_files():
        h.update(module.read_bytes())
    return h.hexdigest()[:8]


def current_versions() -> dict[str, str]:
    """The versions whose change can change results: torch, triton, and tilewright's own
    version with the digest of its checking rules (``0.1.0+c1a2b3c4``)."""
    import torch

    import tilewright

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        triton_version = "none"
    return {"torch": torch.__version__, "triton": triton_version,
            "tilewright": f"{tilewright.__version__}+{check_rules_digest()}"}


def measurement_rules() -> str:
    """The settings a record was measured under that change its verdict, its time or the
    source it ran: whether candidates were checked against the reference, TF32, PDL, and how
    many input sets timing cycled through (``check=1 tf32=0 pdl=auto input_sets=3``)."""
    from tilewright._config import config

    return (f"check={int(config.check_candidates)} tf32={int(config.allow_tf32)} pdl={config.pdl} "
            f"input_sets={config.bench_input_sets}")


@dataclass(frozen=True)
class ProblemKey:
    """Everything a tuning result depends on besides the candidate itself.

    The problem carries sizes (or bucket), layouts, dtypes and epilogue (its ``op`` is display
    only and stays out of the digest); ``target`` the chip; the versions the software that
    compiles and runs the kernels; ``rules`` the settings it was measured under
    (:func:`measurement_rules`).
    """

    problem: Any  # a problem of any registered kind (tilewright.kinds)
    target: str
    torch_version: str
    triton_version: str
    tilewright_version: str
    rules: str = ""

    @staticmethod
    def from_entry(entry: dict[str, Any]) -> "ProblemKey":
        """The key an entry's JSON holds (its own fields, never the id it is filed under)."""
        from tilewright.kinds import problem_from_json

        return ProblemKey(problem_from_json(entry["problem"]), entry["target"], entry["torch_version"],
                          entry["triton_version"], entry["tilewright_version"], entry.get("rules", ""))

    @staticmethod
    def for_problem(problem: Any, target: str) -> "ProblemKey":
        v = current_versions()
        return ProblemKey(problem, target, v["torch"], v["triton"], v["tilewright"], measurement_rules())

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["problem"] = self.problem.to_json()
        return d

    @functools.cached_property
    def digest(self) -> str:
        """The key's id in the file (computed once per key: the problem's JSON is costly)."""
        d = self.to_json()
        from tilewright.kinds import kind_of  # the registry imports the cache

        labels = {"op", *kind_of(self.problem).display_fields}  # fields that only label it
        d["problem"] = {k: v for k, v in d["problem"].items() if k not in labels}
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


STATUSES = ("ok", "wrong", "failed", "aborted")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _time_problem(name: str, v: Any) -> str | None:
    if v is None:
        return None
    if not _is_number(v):
        return f"{name} is {v!r}, not a number"
    if not math.isfinite(v) or v < 0:
        return f"{name} is {v!r}, not a finite time >= 0"
    return None


def record_problem(d: Any) -> str | None:
    """Why a record's JSON is not a valid :class:`Record` (None when it is): a missing field, a
    wrong type, a NaN, negative or infinite time, an unknown status, an "ok" without a time."""
    if not isinstance(d, dict):
        return f"is a {type(d).__name__}, not an object"
    for name in ("template_id", "template_hash", "status"):
        if not isinstance(d.get(name), str):
            return f"{name} is missing or not a string" if name not in d else f"{name} is {d[name]!r}, not a string"
    if d["status"] not in STATUSES:
        return f"status is {d['status']!r}, not one of {', '.join(STATUSES)}"
    if not isinstance(d.get("params"), dict):  # required: Record has no default for it
        return "params is missing" if "params" not in d else f"params is {d['params']!r}, not an object"
    for name in ("median_ms", "spread_ms", "predicted_ms"):
        why = _time_problem(name, d.get(name))
        if why:
            return why
    if d["status"] in ("ok", "aborted") and d.get("median_ms") is None:
        return f"a {d['status']!r} record has no median_ms"
    rel = d.get("rel_err")
    if rel is not None and (not _is_number(rel) or math.isnan(rel) or rel < 0):
        return f"rel_err is {rel!r}, not an error >= 0"
    for name in ("reps", "rank"):
        v = d.get(name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            return f"{name} is {v!r}, not a count >= 0"
    if not isinstance(d.get("reason", ""), str):
        return f"reason is {d['reason']!r}, not a string"
    created = d.get("created", 0)
    if not _is_number(created) or not math.isfinite(created):
        return f"created is {created!r}, not a time stamp"
    return None


def entry_problem(entry: Any, digest: str | None = None) -> str | None:
    """Why a problem entry's JSON is unusable as a whole (None when it is usable): its key
    fields are missing or of the wrong type, its problem does not parse, ``records`` is not an
    object, or (given the ``digest`` it is filed under) its key does not hash to that digest: a
    record moved under another problem's id, or a problem edited in place, never counts for it."""
    if not isinstance(entry, dict):
        return f"the entry is a {type(entry).__name__}, not an object"
    for name in ("target", "torch_version", "triton_version", "tilewright_version"):
        if not isinstance(entry.get(name), str):
            return f"{name} is missing or not a string"
    if not isinstance(entry.get("rules", ""), str):
        return "rules is not a string"
    if not isinstance(entry.get("records"), dict):
        return f"records is {type(entry.get('records')).__name__}, not an object"
    try:
        key_digest = _key_digest(_key_text(entry))
    except Exception as e:  # noqa: BLE001 - any way a problem fails to parse makes it unusable
        return f"its problem does not parse ({type(e).__name__}: {e})"
    if digest is not None and key_digest != digest:
        return f"it is filed under {digest} but its key hashes to {key_digest}"
    return None


_KEY_FIELDS = ("problem", "target", "torch_version", "triton_version", "tilewright_version", "rules")


def _key_text(entry: dict[str, Any]) -> str:
    return json.dumps({k: entry[k] for k in _KEY_FIELDS if k in entry}, sort_keys=True)


_key_digests: dict[str, str] = {}
_KEY_DIGESTS_MAX = 4096


def _key_digest(fields: str) -> str:
    """The digest of the key that an entry's key fields (as sorted JSON, :func:`_key_text`)
    hold. Remembered by that text: parsing a problem (its sympy sizes) is most of checking an
    entry, and a tuning step checks its problem's entry three times (look-up, merge, decision)
    with the same text; an entry this process writes is remembered from the key it was written
    from (:func:`_remember_key`). A problem that does not parse raises, and is not remembered."""
    digest = _key_digests.get(fields)
    if digest is None:
        digest = ProblemKey.from_entry(json.loads(fields)).digest
        _remember(fields, digest)
    return digest


def _remember(fields: str, digest: str) -> None:
    if len(_key_digests) >= _KEY_DIGESTS_MAX:
        _key_digests.clear()
    _key_digests[fields] = digest


def _remember_key(entry: dict[str, Any], key: ProblemKey) -> None:
    """``entry`` holds ``key.to_json()``: its key fields are known to hash to ``key.digest``."""
    _remember(_key_text(entry), key.digest)


@dataclass(frozen=True)
class Record:
    """What tuning learned about one candidate for one problem.

    ``status``: "ok" (checked and timed), "wrong" (failed the correctness check), "failed"
    (compile or run error, crash, timeout), "aborted" (first run far slower than the best).
    Times in ms. ``rank`` and ``predicted_ms`` are the policy's view when it was measured (for
    display; selection re-ranks with the installed policy).
    """

    template_id: str
    template_hash: str
    params: dict[str, Any]
    status: str
    median_ms: float | None = None
    spread_ms: float | None = None
    reps: int = 0
    rel_err: float | None = None
    reason: str = ""
    rank: int | None = None
    predicted_ms: float | None = None
    created: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Record":
        """The record a JSON object holds (unknown fields are dropped).

        Raises:
            ValueError: the object is not a valid record (:func:`record_problem` says why).
        """
        why = record_problem(d)
        if why:
            raise ValueError(f"invalid tuning record: {why}")
        names = {f.name for f in dataclasses.fields(Record)}
        return Record(**{k: v for k, v in d.items() if k in names})


def _first_file_above(path: Path) -> Path | None:
    for p in (path, *path.parents):
        if p.is_file():
            return p
    return None


def _looks_like_ours(raw: bytes) -> bool:
    """Whether bytes that do not parse were a tuning cache (the file starts as one)."""
    head = raw[:256].lstrip()
    return head.startswith(b"{") and _FORMAT_FAMILY.encode() in head


class TuningCache:
    """The tuning records in one JSON file, shared between processes.

    Args:
        path: the JSON file; its folder is created when first written.
        read_only: never write, lock, create or move anything (``cache list``/``export``): a
            damaged file reads as empty, with a warning.
        strict: raise :class:`~tilewright.errors.CacheFileError` when the file is refused or
            cannot be written (the command line). When false (a compiled model), warn once and
            go on with an in-memory cache.
    """

    @property
    def _lock(self) -> filelock.BaseFileLock:
        """The file's cross-process lock, made in this process: filelock refuses an instance a
        forked child inherited (a data-loader worker or a bench child forked after tuning)."""
        if self._file_lock is None or self._file_lock[0] != os.getpid():
            self._file_lock = (os.getpid(), filelock.FileLock(str(self.path) + ".lock"))
        return self._file_lock[1]

    def __init__(self, path: Path | str, *, read_only: bool = False, strict: bool = True):
        # a symlinked cache is the file it points to: it is replaced there (the link stays) and
        # locked beside it, so two links to one shared file share one lock
        self.path = Path(os.path.realpath(Path(path).expanduser()))
        self.read_only = read_only
        self.strict = strict
        self._file_lock: tuple[int, filelock.BaseFileLock] | None = None  # (pid, lock)
        self._mem_lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._data: dict[str, Any] = {"format": FORMAT, "problems": {}}
        self._memory_only: str | None = None  # why the file is no longer used
        self._warned: set[tuple[str, str]] = set()

    @property
    def persistent(self) -> bool:
        """False once the cache has fallen back to memory (see ``strict``)."""
        return self._memory_only is None

    # -- reading --------------------------------------------------------------------------------
    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _parse(self) -> dict[str, Any]:
        """The file's contents.

        Raises:
            ValueError: the file is a damaged tuning cache (truncated, wrong shape): quarantine it.
            CacheFileError: the file is something else (a README, an exported bundle, an SQLite
                database, another format) or cannot be read: refuse it and leave it alone.
        """
        special = special_file_reason(self.path)
        if special:  # never read (a FIFO would hang) and never moved: /dev/null stays /dev/null
            raise CacheFileError(f"{special}, so it cannot be a tuning cache; point --cache or "
                                 f"TILEWRIGHT_CACHE_DIR at a file path")
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {"format": FORMAT, "problems": {}}
        except NotADirectoryError:
            blocker = _first_file_above(self.path.parent)
            raise CacheFileError(f"{blocker} is a file, so it cannot hold the tuning cache {self.path}; "
                                 f"set TILEWRIGHT_CACHE_DIR (or --cache) to a folder or a new path") from None
        except IsADirectoryError:
            raise CacheFileError(f"{self.path} is a folder, not a tuning cache file; give a file "
                                 f"path (e.g. {self.path / 'tuning.json'})") from None
        except OSError as e:
            raise CacheFileError(f"cannot read the tuning cache {self.path} ({e.strerror or e}); "
                                 f"fix its permissions or use another TILEWRIGHT_CACHE_DIR / --cache") from None
        fix = "point --cache or TILEWRIGHT_CACHE_DIR at a tuning cache, or at a path that does not exist yet"
        if raw.startswith(b"SQLite format 3\x00"):
            raise CacheFileError(f"{self.path} is an SQLite file (an exported tuning bundle?), not a "
                                 f"tuning cache; load it with `tilewright cache import {self.path}`")
        if not raw.strip():  # an empty file (touched, or a cache that lost everything) holds nothing
            return {"format": FORMAT, "problems": {}}
        try:
            data = json.loads(raw.decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if _looks_like_ours(raw):
                raise ValueError(f"{type(e).__name__}: {e}") from None
            raise CacheFileError(f"{self.path} is not a tuning cache (it is not a file tilewright "
                                 f"wrote); left it as it is: {fix}") from None
        fmt = data.get("format") if isinstance(data, dict) else None
        if fmt == FORMAT:
            if not isinstance(data.get("problems"), dict):
                raise ValueError("its 'problems' is not an object")
            return data
        if isinstance(fmt, str) and fmt.startswith(_BUNDLE_FAMILY):
            raise CacheFileError(f"{self.path} is an exported tuning bundle ({fmt}), not a tuning "
                                 f"cache; load it with `tilewright cache import {self.path}`")
        if isinstance(fmt, str) and fmt.startswith(_FORMAT_FAMILY):
            raise CacheFileError(f"{self.path} is a {fmt} tuning cache, which this tilewright "
                                 f"(reading {FORMAT}) does not understand; upgrade tilewright, or "
                                 f"use another cache file")
        raise CacheFileError(f"{self.path} is not a tuning cache (it has no \"format\": \"{FORMAT}\"); "
                             f"left it as it is: {fix}")

    def _read_file(self) -> dict[str, Any]:
        """The file's contents, or an empty cache after quarantining a damaged one (a read-only
        cache only warns)."""
        try:
            return self._parse()
        except ValueError as e:
            if self.read_only:
                self._warn_once(("damaged", ""), "tuning cache %s is damaged (%s); reading it as empty. "
                                "The next command that writes to it moves it aside.", self.path, e)
                return {"format": FORMAT, "problems": {}}
            with self._lock:  # re-check under the lock: a writer may have just replaced it
                try:
                    return self._parse()
                except ValueError:
                    self._quarantine(str(e))
            return {"format": FORMAT, "problems": {}}

    def _quarantine(self, why: str) -> None:
        dest = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time() * 1000)}")
        try:
            os.replace(self.path, dest)
        except FileNotFoundError:
            return
        log.warning("tuning cache %s was damaged (%s); moved it to %s and starting afresh",
                    self.path, why, dest)

    def _warn_once(self, what: tuple[str, str], msg: str, *args: Any) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(msg, *args)

    def _fall_back(self, e: BaseException) -> None:
        """Go on in memory (a lenient cache) or raise (a strict one)."""
        if self.strict:
            raise e
        if self._memory_only is None:
            self._memory_only = str(e)
            log.warning("%s; tuning results are kept in memory for this process only", e)

    def _snapshot(self) -> dict[str, Any]:
        with self._mem_lock:
            if self._memory_only is not None:
                return self._data
            try:
                stamp = self._file_stamp()
                if stamp != self._stamp:
                    self._data = self._read_file()
                    self._stamp = self._file_stamp()
            except (CacheFileError, OSError) as e:
                self._fall_back(e if isinstance(e, CacheFileError) else self._unusable(e))
            return self._data

    def _unusable(self, e: OSError) -> CacheFileError:
        blocker = _first_file_above(self.path.parent)
        if blocker is not None:
            return CacheFileError(f"{blocker} is a file, so it cannot hold the tuning cache {self.path}; "
                                  f"set TILEWRIGHT_CACHE_DIR (or --cache) to a folder or a new path")
        return CacheFileError(f"cannot write the tuning cache {self.path} ({type(e).__name__}: "
                              f"{e.strerror or e}); set TILEWRIGHT_CACHE_DIR (or --cache) to a "
                              f"writable place")

    def check(self) -> None:
        """Read the file now, so a command refuses a foreign file before doing any work.

        Raises:
            CacheFileError: the file is not a tuning cache (see :meth:`_parse`).
        """
        self._snapshot()

    def _valid(self, digest: str, entry: Any) -> dict[str, Record] | None:
        """An entry's valid records, or None for an unusable entry; each invalid record (or
        entry) is reported once per process."""
        why = entry_problem(entry, digest)
        if why:
            self._warn_once((digest, ""), "tuning cache %s: problem %s is invalid (%s); it counts as "
                            "a miss. `tilewright cache prune` removes it.", self.path, digest, why)
            return None
        out = {}
        for ck, d in entry["records"].items():
            why = record_problem(d)
            if why:
                self._warn_once((digest, ck), "tuning cache %s: record %s of problem %s is invalid "
                                "(%s); it counts as a miss. `tilewright cache prune` removes it.",
                                self.path, ck, digest, why)
                continue
            out[ck] = Record.from_json(d)
        return out

    def lookup(self, key: ProblemKey) -> dict[str, Record]:
        """Valid records for a problem, by candidate key (may be empty)."""
        entry = self._snapshot()["problems"].get(key.digest)
        if entry is None:
            return {}
        return self._valid(key.digest, entry) or {}

    def decision(self, key: ProblemKey) -> str | None:
        """The candidate key recorded as this problem's decision (see :meth:`store`), if any."""
        entry = self._snapshot()["problems"].get(key.digest)
        d = entry.get("decision") if isinstance(entry, dict) else None
        return d.get("candidate") if isinstance(d, dict) and isinstance(d.get("candidate"), str) else None

    def entries(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(digest, entry) for every usable problem in the file; entries hold problem, target,
        versions, rules and the valid records, as JSON."""
        for digest, entry in self._snapshot()["problems"].items():
            records = self._valid(digest, entry)
            if records is not None:
                yield digest, {**entry, "records": {ck: r.to_json() for ck, r in records.items()}}

    # -- writing --------------------------------------------------------------------------------
    def store(self, key: ProblemKey, records: dict[str, Record],
              decide: Callable[[dict[str, Record]], str | None] | None = None) -> str | None:
        """Merge records for one problem into the file (multi-process safe).

        With ``decide`` (all the problem's valid records after the merge -> the chosen candidate
        key), the problem's decision is settled under the lock: a decision already recorded by
        another process stands while its record is still a timed, checked one and ``records``
        brings no candidate the entry did not have; otherwise ``decide`` makes it and it is
        recorded. Returns the decision (None without ``decide``).
        """
        entry = {**key.to_json(), "records": {k: r.to_json() for k, r in records.items()}}
        _remember_key(entry, key)
        decisions, _ = self._merge({key.digest: entry}, decide={key.digest: decide} if decide else {})
        return decisions.get(key.digest)

    def merge(self, problems: dict[str, dict[str, Any]]) -> int:
        """Merge whole entries (digest -> entry JSON) into the file; a record already present
        is replaced by the newer one. Returns the number of records written."""
        return self._merge(problems, {})[1]

    def _merge(self, problems: dict[str, dict[str, Any]],
               decide: dict[str, Callable[[dict[str, Record]], str | None]]) -> tuple[dict[str, str | None], int]:
        if self.read_only:
            raise RuntimeError(f"tuning cache {self.path} was opened read-only")

        def apply(data: dict[str, Any]) -> tuple[dict[str, str | None], int]:
            out, n = {}, 0
            for digest, entry in problems.items():
                dest = data["problems"].get(digest)
                if entry_problem(dest, digest) is not None:  # absent, or unusable: this entry replaces it
                    dest = data["problems"][digest] = {k: v for k, v in entry.items()
                                                       if k not in ("records", "decision")} | {"records": {}}
                added = False
                for ck, rec in entry.get("records", {}).items():
                    old = dest["records"].get(ck)
                    added |= record_problem(old) is not None
                    if record_problem(old) is not None or old.get("created", 0) <= rec.get("created", 0):
                        dest["records"][ck] = rec
                        n += 1
                if digest in decide:
                    out[digest] = self._settle(digest, dest, decide[digest], added)
            return out, n

        if self._memory_only is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self._lock:
                    data = self._read_file()
                    out = apply(data)
                    self._write(data)
                return out
            except (CacheFileError, OSError) as e:
                self._fall_back(e if isinstance(e, CacheFileError) else self._unusable(e))
        with self._mem_lock:
            return apply(self._data)

    def _settle(self, digest: str, entry: dict[str, Any],
                decide: Callable[[dict[str, Record]], str | None], added: bool) -> str | None:
        """The entry's decision: the recorded one while its record is still timed and no
        candidate new to the entry came in (a new template or setting is a new contest)."""
        records = self._valid(digest, entry) or {}
        d = entry.get("decision")
        ck = d.get("candidate") if isinstance(d, dict) else None
        rec = records.get(ck) if isinstance(ck, str) else None
        if not added and rec is not None and rec.status in ("ok", "aborted"):
            return ck
        chosen = decide(records)
        if chosen is not None:
            entry["decision"] = {"candidate": chosen, "created": time.time(), "pid": os.getpid()}
        return chosen

    def rewrite(self, keep: Callable[[dict[str, Any], str, dict[str, Any]], bool]) -> tuple[int, int]:
        """Keep only valid records for which ``keep(entry, candidate_key, record_json)`` is true;
        invalid records and entries, and entries left empty, go too. Returns (records removed by
        ``keep``, invalid records and entries removed)."""
        if self.read_only:
            raise RuntimeError(f"tuning cache {self.path} was opened read-only")
        removed = invalid = 0
        try:
            with self._lock:
                data = self._read_file()
                for digest in list(data["problems"]):
                    entry = data["problems"][digest]
                    if entry_problem(entry, digest) is not None:
                        del data["problems"][digest]
                        invalid += 1
                        continue
                    for ck in list(entry["records"]):
                        if record_problem(entry["records"][ck]) is not None:
                            del entry["records"][ck]
                            invalid += 1
                        elif not keep(entry, ck, entry["records"][ck]):
                            del entry["records"][ck]
                            removed += 1
                    if not entry["records"]:
                        del data["problems"][digest]
                self._write(data)
        except OSError as e:
            raise self._unusable(e) from None
        return removed, invalid

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            # no indent: json's C encoder only serves unindented output, and the file is
            # rewritten once per tuned problem (indented, 5-6x the time: ~0.4 s of a model's
            # first call when it has some 40 problems)
            tmp.write_text(json.dumps(data, sort_keys=True))
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)
        with self._mem_lock:
            self._data, self._stamp = data, self._file_stamp()


_caches: dict[Path, TuningCache] = {}


def default_cache() -> TuningCache:
    """The cache of compiled models and the public ops: the file under ``config.cache_dir``,
    lenient (a refused or unwritable file falls back to memory with one warning); one object
    per path per process."""
    from tilewright._config import config

    path = config.cache_path / "autotune" / "tuning.json"
    if path not in _caches:
        _caches[path] = TuningCache(path, strict=False)
    return _caches[path]
