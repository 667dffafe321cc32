"""Trust (issue 9): the cache never destroys a user's file, invalid records are misses, a record
counts only under the rules it was measured by, candidates cannot corrupt each other's inputs,
processes share one decision per problem, and failures cost one GEMM, never the graph."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fakes import Behaviour, FakeFactory, FakePolicy

import tilewright
from tilewright.autotune import cache as cache_mod
from tilewright.autotune import select as select_mod
from tilewright.autotune.cache import ProblemKey, Record, TuningCache
from tilewright.autotune.cache_io import import_bundle, prune
from tilewright.cli.main import main
from tilewright.errors import CacheFileError
from tilewright.problem import GemmProblem
from tilewright.runtime.targets import get_target

PROBLEM = GemmProblem(M=24, N=40, K=16, dtype="fp32")
SHAPES = Path(__file__).parent.parent / "bench" / "cases" / "llm_gemm_shapes.json"

FOREIGN = {
    "readme": b"# My project\n\nNotes I would hate to lose.\n",
    "bundle": b'{"format": "tilewright-tuning-bundle/1", "problems": {}}',
    "sqlite": b"SQLite format 3\x00" + b"\x00" * 100,
    "newer_format": b'{"format": "tilewright-tuning/2", "problems": {}}',
    "other_json": b'{"a": 1}',
    "json_list": b"[1, 2]",
    "binary": b"\xff\xfe\x00binary",
}

# every command that takes --cache, read-only ones included
COMMANDS = [["cache", "list"], ["cache", "export", "{out}"], ["cache", "import", "{bundle}"],
            ["cache", "prune", "--all"], ["explain", "8", "8", "8"],
            ["warm", str(SHAPES), "--models", "all-minilm-l6-v2", "--m", "1", "--target", "cpu"]]


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.fixture
def bundle(tmp_path):
    path = tmp_path / "ship" / "b.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"format": "tilewright-tuning-bundle/1", "problems": {}}))
    return path


# -- 1. files are never destroyed --------------------------------------------------------------
@pytest.mark.parametrize("what", list(FOREIGN))
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_files_are_never_destroyed_by_any_command(tmp_path, bundle, capsys, what, command):
    folder = tmp_path / "work"
    folder.mkdir()
    target = folder / "tuning.json"
    target.write_bytes(FOREIGN[what])
    before = _files(folder)
    args = [a.format(out=tmp_path / "out.json", bundle=bundle) for a in command]
    assert main([*args, "--cache", str(target)]) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("error:") and str(target) in out.replace("\n", "")
    assert len(out.replace("\n", "")) < 400, "one line, not a traceback"
    assert _files(folder) == before, "nothing written, moved or created beside the file"


def test_files_are_never_destroyed_when_the_cache_dir_is_a_file(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_bytes(FOREIGN["readme"])
    with tilewright.config.patch(cache_dir=str(readme)):
        for cmd in (["cache", "list"], ["cache", "prune"]):
            assert main(cmd) == 2
            assert "is a file" in capsys.readouterr().out
    assert readme.read_bytes() == FOREIGN["readme"]


def test_files_are_never_destroyed_by_a_compiled_model(tmp_path, caplog):
    """A compiled model whose cache dir points at a README runs, matches eager, warns once, and
    leaves the README as it was (tuning results stay in memory)."""
    readme = tmp_path / "README.md"
    readme.write_bytes(FOREIGN["readme"])
    cache_mod._caches.clear()
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.GELU())
    x = torch.randn(8, 16)
    with tilewright.config.patch(cache_dir=str(readme)), caplog.at_level(logging.WARNING):
        out = torch.compile(model, backend="tilewright")(x)
    cache_mod._caches.clear()
    assert torch.allclose(out, model(x), atol=1e-5, rtol=1e-4)
    assert readme.read_bytes() == FOREIGN["readme"]
    assert sum("in memory for this process" in r.getMessage() for r in caplog.records) == 1


def test_files_are_never_destroyed_only_a_damaged_cache_is_quarantined(tmp_path, capsys):
    path = tmp_path / "tuning.json"
    TuningCache(path).store(ProblemKey.for_problem(PROBLEM, "cpu"), {"c": Record("t", "h", {}, "ok", 1.0)})
    damaged = path.read_bytes()[:-40]
    path.write_bytes(damaged)
    (tmp_path / "tuning.json.lock").unlink()
    # read-only commands report it and leave it exactly as it is: no move, no lock file
    for cmd in (["cache", "list"], ["cache", "export", str(tmp_path / "x" / "out.json")]):
        assert main([*cmd, "--cache", str(path)]) == 0
        assert _files(tmp_path) == {"tuning.json": damaged}
    # a writing command moves it aside (kept, never deleted) and starts afresh
    assert main(["cache", "prune", "--cache", str(path)]) == 0
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("tuning.json.corrupt-")]
    assert len(kept) == 1 and kept[0].read_bytes() == damaged


def test_files_are_never_destroyed_by_export_over_a_user_file(tmp_path, capsys):
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}')
    cache = tmp_path / "tuning.json"
    assert main(["cache", "export", str(notes), "--cache", str(cache)]) == 2
    assert "not overwriting" in capsys.readouterr().out
    assert notes.read_text() == '{"mine": true}'


# -- 2. invalid records are misses, never errors ----------------------------------------------
def _good(entry: dict) -> dict:
    return next(r for r in entry["records"].values() if r["params"].get("name") == "good")


def _mutations():
    def rec(**kw):
        return lambda e: _good(e).update(kw)

    def drop(name):
        return lambda e: _good(e).pop(name)

    return {
        "missing_field": drop("template_hash"),
        # issue 21: a record without its params made choosing fail (Record() raised TypeError)
        "missing_params": drop("params"),
        "string_median": rec(median_ms="fast"),
        "nan_median": rec(median_ms=math.nan),
        "negative_median": rec(median_ms=-1.0),
        "unknown_status": rec(status="great"),
        "bool_reps": rec(reps=True),
        "records_not_a_dict": lambda e: e.update(records=[1, 2]),
        "problem_unparsable": lambda e: e.update(problem={"M": "x"}),
    }


@pytest.fixture
def sim(monkeypatch):
    def run(behaviours, cache, noise=0.0, seed=0):
        factory = FakeFactory(behaviours, noise=noise, seed=seed)
        monkeypatch.setattr(select_mod, "policy_for", lambda op, t: FakePolicy(list(behaviours)))
        return select_mod.select_gemm(PROBLEM, get_target("cpu"), factory, cache=cache), factory

    return run


@pytest.mark.parametrize("mutation", list(_mutations()))
def test_invalid_records_are_misses_never_errors(tmp_path, sim, caplog, capsys, monkeypatch, mutation):
    behaviours = {"aten": Behaviour("good", 5.0), "good": Behaviour("good", 1.0)}
    path = tmp_path / "tuning.json"
    sim(behaviours, TuningCache(path))
    data = json.loads(path.read_text())
    (digest, entry), = data["problems"].items()
    _mutations()[mutation](entry)
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        sel, factory = sim(behaviours, TuningCache(path))
    assert sel.winner.param_dict["name"] == "good", "the damaged record is measured again"
    assert "good" in factory.builds
    warnings = [r.getMessage() for r in caplog.records if "invalid" in r.getMessage()]
    assert len(warnings) == 1 and "cache prune" in warnings[0]
    # the tools read past it too, and prune removes what does not validate
    assert main(["cache", "list", "--all", "--cache", str(path)]) == 0
    monkeypatch.undo()  # the real policy, for explain
    with tilewright.config.patch(force_backend="aten"):
        assert main(["explain", "24", "40", "16", "--dtype", "fp32", "--layout-b", "row",
                     "--cache", str(path)]) == 0
    capsys.readouterr()

    def all_valid() -> bool:
        return all(cache_mod.entry_problem(e) is None
                   and all(cache_mod.record_problem(r) is None for r in e["records"].values())
                   for e in json.loads(path.read_text())["problems"].values())

    assert all_valid(), "measuring it again replaced the damaged record"
    path.write_text(json.dumps(data))
    assert prune(TuningCache(path)).invalid >= 1 and all_valid()


@pytest.mark.parametrize("mutation", ["string_median", "nan_median", "missing_field", "unknown_status"])
def test_invalid_records_are_misses_at_import(tmp_path, sim, caplog, mutation):
    path = tmp_path / "tuning.json"
    sim({"aten": Behaviour("good", 5.0), "good": Behaviour("good", 1.0)}, TuningCache(path))
    data = json.loads(path.read_text())
    (entry,) = data["problems"].values()
    _mutations()[mutation](entry)
    data["format"] = "tilewright-tuning-bundle/1"
    bundle = tmp_path / "b.json"
    bundle.write_text(json.dumps(data))
    fresh = TuningCache(tmp_path / "fresh.json")
    with caplog.at_level(logging.WARNING):
        assert import_bundle(fresh, bundle) == 1, "the valid record comes in, the invalid one not"
    assert any("skipped record" in r.getMessage() and '"good"' in r.getMessage() for r in caplog.records)


# -- 3. a record only counts under the rules it was measured by -------------------------------
@pytest.mark.parametrize("setting", [{"check_candidates": False}, {"allow_tf32": True},
                                     {"pdl": "on"}, {"bench_input_sets": 1}])
def test_a_record_only_counts_under_the_rules_it_was_measured_by(setting):
    before = ProblemKey.for_problem(PROBLEM, "cpu").digest
    with tilewright.config.patch(**setting):
        assert ProblemKey.for_problem(PROBLEM, "cpu").digest != before


def test_a_record_only_counts_under_its_rules_and_op_is_display_only():
    key = ProblemKey.for_problem(PROBLEM, "cpu")
    assert ProblemKey.for_problem(dataclasses.replace(PROBLEM, op="addmm"), "cpu").digest == key.digest


def test_a_record_only_counts_under_its_rules_unchecked_is_not_trusted_checked(tmp_path, sim):
    path = tmp_path / "tuning.json"
    behaviours = {"aten": Behaviour("good", 5.0), "wrong_fast": Behaviour("wrong", 0.5)}
    with tilewright.config.patch(check_candidates=False):
        assert sim(behaviours, TuningCache(path))[0].winner.param_dict["name"] == "wrong_fast"
    sel, factory = sim(behaviours, TuningCache(path))
    assert "wrong_fast" in factory.builds and sel.winner.template_id == "aten.gemm"


# -- 4. candidates do not share mutable state ---------------------------------------------------
@pytest.mark.parametrize("kind", ["scribble", "scribble_late"])
def test_candidates_do_not_share_mutable_state(tmp_path, sim, kind):
    behaviours = {"aten": Behaviour("good", 5.0), "vandal": Behaviour(kind, 0.5),
                  "next": Behaviour("good", 1.0)}
    sel, _ = sim(behaviours, TuningCache(tmp_path / "t.json"))
    status = {r.candidate.param_dict.get("name", "aten"): r.record for r in sel.results}
    assert status["vandal"].status == "wrong" and "input" in status["vandal"].reason
    assert status["next"].status == "ok", "the candidate after it sees fresh inputs"
    assert sel.winner.param_dict["name"] == "next"


def test_candidates_do_not_share_mutable_state_fingerprint_sees_one_byte():
    from tilewright.autotune.evaluate import fingerprint
    from tilewright.autotune.inputs import make_inputs

    p = GemmProblem(M=8, N=8, K=8, dtype="bf16", layout_b="col")
    x = make_inputs(p, "cpu", 0)
    before = fingerprint(x)
    raw = torch.empty(0, dtype=torch.uint8).set_(x.b.untyped_storage())
    raw[3] ^= 1  # one bit of the transposed weight's storage
    assert fingerprint(x) != before


# -- 5. one decision per problem across processes ----------------------------------------------
def test_one_decision_per_problem_across_processes(tmp_path, sim):
    """Rank 0 decides first; rank 1 measured the two near-equal kernels the other way round in
    its own noise, yet adopts rank 0's decision: both run the same kernel."""
    path = tmp_path / "shared.json"
    first, _ = sim({"aten": Behaviour("good", 9.0), "a": Behaviour("good", 1.0), "b": Behaviour("good", 1.5)},
                   TuningCache(path))
    assert first.winner.param_dict["name"] == "a"
    # rank 1 started before rank 0's records landed: it measures everything itself, and b looks
    # faster to it
    monkey = TuningCache(path)
    real_lookup = monkey.lookup
    calls = []

    def late_lookup(key):
        calls.append(1)
        return {} if len(calls) == 1 else real_lookup(key)

    monkey.lookup = late_lookup
    second, factory = sim({"aten": Behaviour("good", 9.0), "a": Behaviour("good", 1.5),
                           "b": Behaviour("good", 1.0)}, monkey)
    assert sorted(factory.builds) == ["a", "aten", "b"], "it did measure"
    assert second.winner.param_dict["name"] == "a" and "another process" in second.reason
    assert TuningCache(path).decision(ProblemKey.for_problem(PROBLEM, "cpu")) == first.winner.key


def test_one_decision_per_problem_a_new_candidate_reopens_it(tmp_path, sim):
    path = tmp_path / "shared.json"
    sim({"aten": Behaviour("good", 9.0), "a": Behaviour("good", 1.0)}, TuningCache(path))
    sel, _ = sim({"aten": Behaviour("good", 9.0), "a": Behaviour("good", 1.0), "c": Behaviour("good", 0.3)},
                 TuningCache(path))
    assert sel.winner.param_dict["name"] == "c"


# -- 7. fail small -------------------------------------------------------------------------------
def test_fail_small_out_of_memory_in_the_reference_costs_one_gemm(tmp_path, sim, monkeypatch):
    def no_memory(self, problem, inputs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB (simulated)")

    monkeypatch.setattr(FakeFactory, "reference", no_memory)
    path = tmp_path / "t.json"
    behaviours = {"aten": Behaviour("good", 5.0), "a": Behaviour("good", 1.0)}
    with pytest.raises(tilewright.errors.NoValidCandidateError, match="out of memory"):
        sim(behaviours, TuningCache(path))
    # nothing was learnt about the candidates: no record says they failed
    assert not TuningCache(path).lookup(ProblemKey.for_problem(PROBLEM, "cpu"))


def test_fail_small_an_unwritable_cache_keeps_results_in_memory(tmp_path, sim, monkeypatch, caplog):
    cache = TuningCache(tmp_path / "t.json", strict=False)

    def refuse(self, data):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(TuningCache, "_write", refuse)
    behaviours = {"aten": Behaviour("good", 5.0), "a": Behaviour("good", 1.0)}
    with caplog.at_level(logging.WARNING):
        sel, _ = sim(behaviours, cache)
        again, factory = sim(behaviours, cache)
    assert sel.winner.param_dict["name"] == again.winner.param_dict["name"] == "a"
    assert factory.builds == [], "the second selection reuses the in-memory records"
    assert not cache.persistent
    assert sum("writable" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(CacheFileError, match="writable"):
        TuningCache(tmp_path / "u.json").store(ProblemKey.for_problem(PROBLEM, "cpu"), {})


def test_fail_small_a_data_dependent_size_costs_only_its_gemm(fresh_cache):
    """The GEMM whose M comes from a boolean mask stays ATen's; the graph is still compiled
    (tests run with TILEWRIGHT_STRICT=1, so a graph that fell back to ATen would raise)."""
    assert tilewright.config.strict
    w = torch.randn(8, 16)

    def f(x):
        return torch.relu(x[x[:, 0] > 0] @ w.T + 1)  # M is data-dependent

    x = torch.randn(64, 16)
    # (Dynamo's config.patch, not monkeypatch: undoing a monkeypatch deletes the setting)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        torch.testing.assert_close(torch.compile(f, backend="tilewright")(x), f(x))


def test_fail_small_with_autotune_off_nothing_is_timed(tmp_path, sim, monkeypatch):
    def no_timing(*a, **k):
        raise AssertionError("timed with autotune off")

    monkeypatch.setattr(FakeFactory, "timer", no_timing)
    path = tmp_path / "t.json"
    with tilewright.config.patch(autotune=False, force_backend="triton"):
        sel, _ = sim({"aten": Behaviour("good", 5.0), "a": Behaviour("good", 1.0)}, TuningCache(path))
    assert sel.winner.param_dict["name"] == "a" and not sel.measured
    assert not path.exists(), "an untimed choice leaves no record"
    with tilewright.config.patch(autotune=False, force_backend="triton"):
        sel, _ = sim({"aten": Behaviour("good", 5.0), "a": Behaviour("wrong", 1.0)}, TuningCache(path))
    assert sel.winner.template_id == "aten.gemm", "a kernel that fails its check is not used"


PEAK = textwrap.dedent("""
    import resource, torch
    from tilewright._config import config
    from tilewright.autotune.cache import TuningCache
    from tilewright.autotune.select import select
    from tilewright.compiler.kernel_factory import default_factory
    from tilewright.problem import GemmProblem
    from tilewright.runtime.targets import get_target
    p = GemmProblem(M=4, N=16384, K=4096, dtype="bf16", layout_b="col", op="mm")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with config.patch(force_backend="aten", bench_rep=3):
        select(p, get_target("cpu"), default_factory, cache=TuningCache({path!r}))
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024
    print(grew / (16384 * 4096 * 2))
""")


@pytest.mark.slow
def test_fail_small_peak_memory_while_tuning_is_bounded(tmp_path):
    """Tuning a wide bf16 GEMM (an lm_head's shape, a 128 MiB weight) peaks under 2.5x the
    weight: the inputs are drawn a slab at a time and the float64 reference goes a slab of
    columns at a time (it was 5.4x: float32 draws and a whole float64 copy of B)."""
    out = subprocess.run([sys.executable, "-c", PEAK.format(path=str(tmp_path / "t.json"))],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) < 2.5


# -- 3 (cont.). a template's hash covers every file it renders through -------------------------
def test_a_record_only_counts_under_its_rules_template_hash_covers_what_it_renders_through(monkeypatch):
    import re

    from tilewright.templates import all_templates
    from tilewright.templates.base import TEMPLATES_ROOT

    for t in all_templates():
        names = {str(p.relative_to(TEMPLATES_ROOT.parent)) for p in t.render_sources}
        assert "templates/base.py" in names
        if t.jinja:
            text = (t.folder / t.jinja).read_text()
            for ref in re.findall(r"{%-?\s*(?:include|import|from|extends)\s+['\"]([^'\"]+)['\"]", text):
                assert any(n.endswith(ref) for n in names), f"{t.id} includes {ref}"
    gemm = next(t for t in all_templates() if t.id == "triton.gemm")
    names = {p.name for p in gemm.render_sources}
    assert {"epilogue.py", "emit.py", "ops.py", "gemm.py.jinja"} <= names
    # a change to any of those files (here: the IR epilogue, two imports away) changes the hash
    target = next(p for p in gemm.render_sources if p.parts[-2:] == ("ir", "epilogue.py"))
    before = gemm.source_hash
    real = type(target).read_bytes
    monkeypatch.setattr(type(target), "read_bytes",
                        lambda self: real(self) + (b"# edited" if self == target else b""))
    assert type(gemm)().source_hash != before


# -- found by a new-user trial -----------------------------------------------------------------
@pytest.fixture
def real_cache(tmp_path, sim):
    path = tmp_path / "tuning.json"
    sim({"aten": Behaviour("good", 5.0), "good": Behaviour("good", 1.0)}, TuningCache(path))
    return path


def test_files_are_never_destroyed_export_never_overwrites_a_tuning_cache(real_cache, tmp_path, capsys):
    before = real_cache.read_bytes()
    other = tmp_path / "other.json"
    other.write_bytes(before)
    for dest in (real_cache, other):  # its own cache, or another one (a typo in the path)
        assert main(["cache", "export", str(dest), "--cache", str(real_cache)]) == 2
        assert "not overwriting" in capsys.readouterr().out
        assert dest.read_bytes() == before
    bundle = tmp_path / "b.json"  # an earlier export is replaced, as asked
    assert main(["cache", "export", str(bundle), "--cache", str(real_cache)]) == 0
    assert main(["cache", "export", str(bundle), "--cache", str(real_cache)]) == 0


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_files_are_never_destroyed_special_files_are_refused_not_read_or_moved(tmp_path, capsys, kind):
    import os
    import stat

    node = tmp_path / "node"
    if kind == "fifo":
        os.mkfifo(node)
    else:
        try:
            os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null
        except PermissionError:
            pytest.skip("making a device node needs root")
    for cmd in (["cache", "list"], ["cache", "prune"], ["cache", "export", str(tmp_path / "o.json")]):
        assert main([*cmd, "--cache", str(node)]) == 2  # a FIFO would hang a reader
        assert "not a regular file" in capsys.readouterr().out
    mode = node.stat().st_mode
    assert (stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISCHR(mode))
    assert [p.name for p in tmp_path.iterdir()] == ["node"]


def test_files_are_never_destroyed_a_symlinked_cache_stays_a_link(real_cache, tmp_path, sim):
    link = tmp_path / "link.json"
    link.symlink_to(real_cache)
    sim({"aten": Behaviour("good", 5.0), "new": Behaviour("good", 2.0)}, TuningCache(link))
    assert link.is_symlink(), "the cache it points to is updated, the link stays"
    assert "new" in real_cache.read_text()


def test_files_are_never_destroyed_an_empty_file_is_an_empty_cache(tmp_path, sim):
    path = tmp_path / "touched.json"
    path.touch()
    sim({"aten": Behaviour("good", 5.0), "a": Behaviour("good", 1.0)}, TuningCache(path))
    assert [p.name for p in tmp_path.iterdir() if "corrupt" in p.name] == []
    assert TuningCache(path).lookup(ProblemKey.for_problem(PROBLEM, "cpu"))


@pytest.mark.parametrize("flag", ["--state", "--json"])
def test_files_are_never_destroyed_by_warm_progress_or_report_files(tmp_path, capsys, flag):
    readme = tmp_path / "README.md"
    readme.write_bytes(FOREIGN["readme"])
    args = ["warm", str(SHAPES), "--models", "all-minilm-l6-v2", "--m", "1", "--target", "cpu",
            "--cache", str(tmp_path / "c.json"), flag, str(readme)]
    for extra in ([], ["--restart"]):
        assert main(args + extra) == 2
        assert "not overwriting" in capsys.readouterr().out
    assert readme.read_bytes() == FOREIGN["readme"]


def test_a_record_only_counts_under_its_rules_even_moved_under_another_id(real_cache, sim, caplog):
    """A record measured unchecked, moved by hand under the checked problem's id, is not trusted:
    every entry's id is recomputed from its own key."""
    data = json.loads(real_cache.read_text())
    (digest, entry), = data["problems"].items()
    with tilewright.config.patch(check_candidates=False):
        unchecked = ProblemKey.for_problem(PROBLEM, "cpu").digest
    data["problems"] = {unchecked: entry}  # the checked entry, filed under the unchecked id
    real_cache.write_text(json.dumps(data))
    with tilewright.config.patch(check_candidates=False), caplog.at_level(logging.WARNING):
        _, factory = sim({"aten": Behaviour("good", 5.0), "good": Behaviour("good", 1.0)},
                         TuningCache(real_cache))
    assert "good" in factory.builds, "the misfiled entry is a miss"
    assert any("hashes to" in r.getMessage() for r in caplog.records)


def test_candidates_do_not_share_mutable_state_even_when_the_vandal_fails(tmp_path, sim):
    behaviours = {"aten": Behaviour("good", 5.0), "vandal": Behaviour("scribble_raise", 0.5),
                  "next": Behaviour("good", 1.0)}
    sel, _ = sim(behaviours, TuningCache(tmp_path / "t.json"))
    status = {r.candidate.param_dict.get("name", "aten"): r.record.status for r in sel.results}
    assert status == {"aten": "ok", "vandal": "failed", "next": "ok"}


def test_fail_small_an_edited_kernel_module_is_rewritten_before_it_runs(fresh_cache, caplog):
    from tilewright.runtime import loader

    src = "def launch(x):\n    return x + 1\n"
    mod = loader.load_module(src, name="trust_probe", interpret=False)
    path = next((fresh_cache / "kernels").rglob("trust_probe_*.py"))
    path.write_text("def launch(x):\n    return x * 2  # edited by hand\n")
    loader._modules.clear()  # a new process: only the file is left
    with caplog.at_level(logging.WARNING):
        fresh = loader.load_module(src, name="trust_probe", interpret=False)
    assert path.read_text() == src and mod.launch(1) == 2 and fresh.launch(1) == 2
    assert any("did not hold the source" in r.getMessage() for r in caplog.records)
