"""The persistent tuning cache: measured results per (problem key, candidate), never code.

One JSON file (``<cache_dir>/autotune/tuning.json``) holds, per problem key, one record per
candidate tried: its status, median time and spread, and error against the reference. Adding a
template or a parameter setting adds records and invalidates none; a template whose source
changed has a new hash, so only its own records stop matching (``prune`` removes them).

Processes share the file safely: writers take a ``filelock``, re-read the file, merge their
records in and replace the file atomically, so two writers racing lose nothing; readers never
see half a file. A file that does not parse is moved aside (``tuning.json.corrupt-<time>``),
reported in the log and rebuilt.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import filelock

from tilewright.errors import CacheFileError
from tilewright.problem import GemmProblem

log = logging.getLogger("tilewright.autotune")
FORMAT = "tilewright-tuning/1"


# the modules that decide a candidate's verdict: its inputs, the reference comparison and the
# tolerances. A record checked under other rules is not reused (the digest is in the key).
CHECK_RULES = ("inputs.py", "kinds.py")


@functools.lru_cache(maxsize=1)
def check_rules_digest() -> str:
    """A digest of the checking rules' source (:data:`CHECK_RULES`)."""
    h = hashlib.sha256()
    for name in CHECK_RULES:
        h.update((Path(__file__).parent / name).read_bytes())
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


@dataclass(frozen=True)
class ProblemKey:
    """Everything a tuning result depends on besides the candidate itself.

    The problem carries op, sizes (or bucket), layouts, dtypes and epilogue; ``target`` the
    chip; the versions the software that compiles and runs the kernels.
    """

    problem: GemmProblem
    target: str
    torch_version: str
    triton_version: str
    tilewright_version: str

    @staticmethod
    def for_problem(problem: GemmProblem, target: str) -> "ProblemKey":
        v = current_versions()
        return ProblemKey(problem, target, v["torch"], v["triton"], v["tilewright"])

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["problem"] = self.problem.to_json()
        return d

    @property
    def digest(self) -> str:
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


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
        names = {f.name for f in dataclasses.fields(Record)}
        return Record(**{k: v for k, v in d.items() if k in names})


class TuningCache:
    """The tuning records in one JSON file, shared between processes.

    Args:
        path: the JSON file; its folder is created when first written.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._lock = filelock.FileLock(str(self.path) + ".lock")
        self._mem_lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._data: dict[str, Any] = {"format": FORMAT, "problems": {}}

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
            ValueError: the file is damaged (not JSON, truncated, wrong shape): quarantine it.
            CacheFileError: the file is intact but is something else (an exported bundle, an
                SQLite database, another format): refuse it and leave it alone.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {"format": FORMAT, "problems": {}}
        if raw.startswith(b"SQLite format 3\x00"):
            raise CacheFileError(f"{self.path} is an SQLite file (an exported tuning bundle?), not a "
                                 f"tuning cache; load it with `tilewright cache import {self.path}`")
        data = json.loads(raw.decode())
        if isinstance(data, dict) and isinstance(data.get("format"), str) and data["format"] != FORMAT:
            raise CacheFileError(
                f"{self.path} is a {data['format']} file, not a tuning cache ({FORMAT}); "
                f"if it is an exported bundle, load it with `tilewright cache import {self.path}`")
        if not isinstance(data, dict) or data.get("format") != FORMAT \
                or not isinstance(data.get("problems"), dict):
            raise ValueError(f"not a {FORMAT} file")
        return data

    def _read_file(self) -> dict[str, Any]:
        """The file's contents, or an empty cache after quarantining a corrupt file."""
        try:
            return self._parse()
        except ValueError as e:
            with self._lock:  # re-check under the lock: a writer may have just replaced it
                try:
                    return self._parse()
                except ValueError:
                    self._quarantine(f"{type(e).__name__}: {e}")
            return {"format": FORMAT, "problems": {}}

    def _quarantine(self, why: str) -> None:
        dest = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time() * 1000)}")
        try:
            os.replace(self.path, dest)
        except FileNotFoundError:
            return
        log.warning("tuning cache %s was unreadable (%s); moved it to %s and starting afresh",
                    self.path, why, dest)

    def _snapshot(self) -> dict[str, Any]:
        with self._mem_lock:
            stamp = self._file_stamp()
            if stamp != self._stamp:
                self._data = self._read_file()
                self._stamp = self._file_stamp()
            return self._data

    def lookup(self, key: ProblemKey) -> dict[str, Record]:
        """Records for a problem, by candidate key (may be empty)."""
        entry = self._snapshot()["problems"].get(key.digest)
        if not entry:
            return {}
        return {k: Record.from_json(v) for k, v in entry.get("records", {}).items()}

    def entries(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(digest, entry) for every problem in the file; entries hold problem, target,
        versions and records as JSON."""
        yield from self._snapshot()["problems"].items()

    # -- writing --------------------------------------------------------------------------------
    def store(self, key: ProblemKey, records: dict[str, Record]) -> None:
        """Merge records for one problem into the file (multi-process safe)."""
        self.merge({key.digest: {**key.to_json(),
                                 "records": {k: r.to_json() for k, r in records.items()}}})

    def merge(self, problems: dict[str, dict[str, Any]]) -> int:
        """Merge whole entries (digest -> entry JSON) into the file; a record already present
        is replaced by the newer one. Returns the number of records written."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        n = 0
        with self._lock:
            data = self._read_file()
            for digest, entry in problems.items():
                dest = data["problems"].setdefault(
                    digest, {k: v for k, v in entry.items() if k != "records"} | {"records": {}})
                for ck, rec in entry.get("records", {}).items():
                    old = dest["records"].get(ck)
                    if old is None or old.get("created", 0) <= rec.get("created", 0):
                        dest["records"][ck] = rec
                        n += 1
            self._write(data)
        return n

    def rewrite(self, keep: Any) -> int:
        """Keep only records for which ``keep(entry, candidate_key, record_json)`` is true;
        entries left empty go too. Returns how many records were removed."""
        removed = 0
        with self._lock:
            data = self._read_file()
            for digest in list(data["problems"]):
                entry = data["problems"][digest]
                for ck in list(entry["records"]):
                    if not keep(entry, ck, entry["records"][ck]):
                        del entry["records"][ck]
                        removed += 1
                if not entry["records"]:
                    del data["problems"][digest]
            self._write(data)
        return removed

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)
        with self._mem_lock:
            self._data, self._stamp = data, self._file_stamp()


_caches: dict[Path, TuningCache] = {}


def default_cache() -> TuningCache:
    """The cache under ``config.cache_dir`` (one object per path per process)."""
    from tilewright._config import config

    path = config.cache_path / "autotune" / "tuning.json"
    if path not in _caches:
        _caches[path] = TuningCache(path)
    return _caches[path]
