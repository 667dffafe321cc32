"""Shipping tuning results: export/import round trips through JSON and SQLite, only choices and
timings travel, prune retires exactly what it is asked to, and the CLI drives all of it."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import pytest

from tilewright.autotune.cache import ProblemKey, Record, TuningCache
from tilewright.autotune.cache_io import (
    BundleError, export_cache, import_bundle, prune, read_bundle,
)
from tilewright.cli.main import main
from tilewright.problem import GemmProblem
from tilewright.templates import get_template

TRITON = get_template("triton.gemm")
ATEN = get_template("aten.gemm")


def key(M: int, versions=None) -> ProblemKey:
    k = ProblemKey.for_problem(GemmProblem(M=M, N=64, K=32, dtype="fp16", layout_b="col"), "cpu")
    return dataclasses.replace(k, **(versions or {}))


def rec(template=TRITON, status="ok", ms=1.0, hash_=None, **params) -> Record:
    return Record(template.id, hash_ or template.source_hash, params, status,
                  median_ms=ms if status == "ok" else None)


@pytest.fixture
def filled(tmp_path) -> TuningCache:
    cache = TuningCache(tmp_path / "tuning.json")
    cache.store(key(16), {"aten": rec(ATEN, ms=2.0), "t64": rec(ms=1.0, BLOCK_M=64),
                          "stale": rec(ms=0.5, hash_="0ld", BLOCK_M=32)})
    cache.store(key(32), {"aten": rec(ATEN, ms=3.0), "bad": rec(status="failed", BLOCK_M=16)})
    cache.store(key(64, {"torch_version": "2.11.0"}), {"aten": rec(ATEN, ms=4.0)})
    return cache


def n_records(cache: TuningCache) -> int:
    return sum(len(e["records"]) for _, e in cache.entries())


@pytest.mark.parametrize("suffix", [".json", ".sqlite"])
def test_export_import_round_trip(filled, tmp_path, suffix):
    bundle = tmp_path / f"model-tuning{suffix}"
    assert export_cache(filled, bundle) == 6
    if suffix == ".sqlite":
        assert sqlite3.connect(bundle).execute("SELECT count(*) FROM records").fetchone()[0] == 6
    other = TuningCache(tmp_path / "other.json")
    assert import_bundle(other, bundle) == 6
    assert other.lookup(key(16))["t64"].median_ms == 1.0
    assert dict(other.entries()).keys() == dict(filled.entries()).keys()


def test_export_current_only_and_by_target(filled, tmp_path):
    assert export_cache(filled, tmp_path / "cur.json", current_only=True) == 4  # no stale, no 2.11
    assert export_cache(filled, tmp_path / "none.json", target="cuda:sm_90a") == 0


def test_bundles_carry_choices_and_timings_never_code(filled, tmp_path):
    bundle = tmp_path / "b.json"
    data = json.loads(filled.path.read_text())
    digest = next(iter(data["problems"]))
    data["problems"][digest]["records"]["aten"]["source"] = "import os; os.system('boom')"
    data["problems"]["forged-digest"] = data["problems"].pop(digest)
    bundle.write_text(json.dumps(data))
    entries = read_bundle(bundle)
    assert "forged-digest" not in entries, "digests are recomputed from the key"
    text = json.dumps(entries)
    assert "os.system" not in text and '"source"' not in text


@pytest.mark.parametrize("content,match", [
    (b"{not json", "does not read"), (b'{"format": "x"}', "not a tuning bundle"),
    (b'{"format": "tilewright-tuning-bundle/1", "problems": [1]}', "no problems object"),
    (b'{"format": "tilewright-tuning-bundle/2", "problems": {}}', "not a tuning bundle"),
])
def test_bad_bundles_are_refused_clearly(tmp_path, content, match):
    path = tmp_path / "b.json"
    path.write_bytes(content)
    with pytest.raises(BundleError, match=match):
        read_bundle(path)
    with pytest.raises(BundleError, match="no tuning bundle"):
        read_bundle(tmp_path / "missing.json")


def test_prune_retires_only_what_it_is_asked(filled):
    assert prune(filled, stale_templates=True).stale_templates == 1
    assert set(filled.lookup(key(16))) == {"aten", "t64"}, "a changed template retires only its own"
    assert prune(filled, failures=True).failures == 1
    assert set(filled.lookup(key(32))) == {"aten"}
    assert prune(filled, other_versions=True).other_versions == 1
    assert n_records(filled) == 3
    assert prune(filled, older_than_days=0.0).older == 3 and n_records(filled) == 0


def test_cli_cache_commands(filled, tmp_path, capsys):
    bundle = tmp_path / "ship.sqlite"
    assert main(["cache", "list", "--cache", str(filled.path), "--all"]) == 0
    out = capsys.readouterr().out
    assert "mm 16x64x32 fp16" in out and "3 problems" in out
    assert main(["cache", "export", str(bundle), "--cache", str(filled.path)]) == 0
    fresh = tmp_path / "fresh.json"
    assert main(["cache", "import", str(bundle), "--cache", str(fresh)]) == 0
    assert n_records(TuningCache(fresh)) == 6
    assert main(["cache", "prune", "--cache", str(fresh)]) == 0
    assert "removed 0 records" in capsys.readouterr().out, "without a flag only invalid records go"
    assert main(["cache", "prune", "--all", "--cache", str(fresh)]) == 0
    assert "removed 3 records" in capsys.readouterr().out
    assert main(["cache", "import", str(tmp_path / "nope.json"), "--cache", str(fresh)]) == 2


def test_cli_prints_brackets_in_paths_and_errors_as_written(filled, tmp_path, capsys):
    # rich markup would eat "[plot]" and "[bold]"; the CLI must print data verbatim
    odd = tmp_path / "run[bold] tilewright[plot]"
    odd.mkdir()
    assert main(["cache", "import", str(odd / "nope.json"), "--cache", str(filled.path)]) == 2
    out = capsys.readouterr().out.replace("\n", "")
    assert out.startswith("error:") and "run[bold] tilewright[plot]" in out
    assert main(["cache", "export", str(odd / "ship.json"), "--cache", str(filled.path)]) == 0
    assert "run[bold] tilewright[plot]/ship.json" in capsys.readouterr().out.replace("\n", "")


def test_loop_kernel_records_list_export_and_import(fresh_cache, tmp_path, capsys):
    """A cache holding loop-kernel problems (tuned with Triton forced) lists, exports and
    imports like one of GEMMs."""
    import torch

    import tilewright
    from tilewright.autotune.cache import default_cache

    torch._dynamo.reset()
    with tilewright.config.patch(force_backend="triton"):
        torch.compile(lambda x: torch.softmax(x * 2, -1), backend="tilewright")(torch.randn(4, 8))
    path = default_cache().path
    assert main(["cache", "list", "--cache", str(path), "--all"]) == 0
    assert "amax" in capsys.readouterr().out
    bundle = tmp_path / "loops.json"
    assert main(["cache", "export", str(bundle), "--cache", str(path)]) == 0
    other = tmp_path / "other.json"
    assert main(["cache", "import", str(bundle), "--cache", str(other)]) == 0


def test_each_kinds_checks_are_checking_rules():
    """A kind's checks (inputs, error, tolerance) live in its folder, kinds/<kind>/checks.py:
    each is part of the digest that keys every record, so editing one re-measures."""
    from pathlib import Path

    import tilewright
    from tilewright.autotune import cache as C

    pkg = Path(tilewright.__file__).parent
    files = {p.relative_to(pkg).as_posix() for p in C.check_rule_files()}
    folders = {f"kinds/{d.name}/checks.py" for d in (pkg / "kinds").iterdir() if (d / "checks.py").exists()}
    assert {"kinds/gemm/checks.py", "kinds/loop/checks.py", "kinds/grouped_gemm/checks.py"} <= folders <= files
    assert "autotune/evaluate.py" in files and "kinds/__init__.py" in files


def test_a_change_of_the_checking_rules_changes_every_key(monkeypatch):
    from tilewright.autotune import cache as C
    from tilewright.problem import GemmProblem

    p = GemmProblem(M=8, N=8, K=8, dtype="fp32")
    before = C.ProblemKey.for_problem(p, "cpu").digest
    assert C.current_versions()["tilewright"].endswith("+" + C.check_rules_digest())
    C.check_rules_digest.cache_clear()
    monkeypatch.setattr(C, "CHECK_RULES", ("autotune/inputs.py",))  # other rules, as after an edit
    try:
        assert C.ProblemKey.for_problem(p, "cpu").digest != before
    finally:
        C.check_rules_digest.cache_clear()
