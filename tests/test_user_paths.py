"""What a new user could not find (issue 21): the launch report of their own model, `explain`
for loop kernels and for any problem kind from JSON or a model, and a command that clears the
cache, removing only what tilewright wrote."""

from __future__ import annotations

import json
import sys

import pytest
import torch

import tilewright
from tilewright.autotune.cache import TuningCache
from tilewright.cli.main import main
from tilewright.runtime.loader import load_module, owned_kernel_modules
from test_cache_io import ATEN, key, n_records, rec


# -- the launch report of one's own model --------------------------------------------------------
def test_launch_report_counts_the_launches_of_a_users_model_inference_and_training():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    report = tilewright.launch_report(model, x, inductor=False)  # Inductor: test_launch_runs
    (g,) = report.graphs
    assert g.kind == "inference" and report.gemms == 2 and report.launches == g.launches
    assert report.launches == report.gemms + report.generated + report.aten
    assert report.launches < report.eager, "fusion launches fewer kernels than eager"
    text = str(report)
    assert "inference" in text and "total" in text and str(report.launches) in text
    train = tilewright.launch_report(model, x, train=True, inductor=False)
    assert [g.kind for g in train.graphs] == ["forward", "backward"]
    assert model[0].weight.grad is not None
    assert json.loads(json.dumps(train.to_json()))["launches"] == train.launches
    with pytest.raises(ValueError, match="requires grad"):
        tilewright.launch_report(lambda a: a * 2, torch.randn(3), train=True)


# -- explain: loop kernels, problems from JSON, a model's kernels -----------------------------
@pytest.fixture
def model_module(tmp_path, monkeypatch):
    (tmp_path / "users_model.py").write_text(
        "import torch\n"
        "def example():\n"
        "    lin = torch.nn.Linear(16, 16)\n"
        "    return torch.nn.Sequential(lin, torch.nn.Softmax(-1)), (torch.randn(4, 16),)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "users_model:example"
    sys.modules.pop("users_model", None)


def test_explain_lists_a_models_kernels_and_explains_a_loop_kernel(model_module, tmp_path, capsys):
    cache = str(tmp_path / "tuning.json")
    assert main(["explain", "--model", model_module, "--cache", cache]) == 0
    listing = capsys.readouterr().out
    assert "gemm" in listing and "reduction" in listing and "amax" in listing
    with tilewright.config.patch(force_backend="triton", bench_rep=1, bench_min_rep=1, bench_warmup=0):
        assert main(["explain", "--model", model_module, "--kernel", "1", "--cache", cache]) == 0
    out = capsys.readouterr().out
    assert "reduction:" in out and "triton.reduction" in out and "winner" in out
    assert main(["explain", "--model", model_module, "--kernel", "9", "--cache", cache]) == 2


def test_explain_takes_any_problem_kind_as_json(tmp_path, capsys):
    from test_loop_kernels import loop_problems

    from tilewright.kernels.grouped import grouped_problem

    (loop,) = loop_problems(lambda a: torch.log_softmax(a, -1), torch.randn(6, 40))
    # a debug dump's selection file holds the problem under "problem"
    dump = tmp_path / "kernel_0_selection.json"
    dump.write_text(json.dumps({"problem": loop.to_json(), "winner": "x", "candidates": []}))
    grouped = tmp_path / "grouped.json"
    grouped.write_text(json.dumps(grouped_problem(torch.randn(32, 16, dtype=torch.bfloat16),
                                                  torch.randn(4, 16, 8, dtype=torch.bfloat16)).to_json()))
    cache = str(tmp_path / "tuning.json")
    with tilewright.config.patch(force_backend="aten"):
        assert main(["explain", "--problem", str(dump), "--cache", cache]) == 0
        assert main(["explain", "--problem", str(grouped), "--cache", cache]) == 0
    out = capsys.readouterr().out
    assert "reduction:" in out and "aten.reduction" in out
    assert "grouped_gemm:" in out and "aten.grouped_gemm" in out
    (tmp_path / "readme.json").write_text('{"a": 1}')
    assert main(["explain", "--problem", str(tmp_path / "readme.json"), "--cache", cache]) == 2
    assert "not a problem" in capsys.readouterr().out
    assert main(["explain", "8", "8", "--cache", cache]) == 2  # half a GEMM


# -- cache clear ---------------------------------------------------------------------------------
def test_cache_clear_removes_every_record_and_only_files_tilewright_wrote(tmp_path, capsys, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TILEWRIGHT_CACHE_DIR", str(root))
    with tilewright.config.patch(cache_dir=str(root)):
        cache = TuningCache(root / "autotune" / "tuning.json")
        cache.store(key(16), {"aten": rec(ATEN, ms=2.0)})
        cache.store(key(32), {"aten": rec(ATEN, ms=3.0)})
        load_module("x = 1\n", name="tw_test_module", interpret=False)
        (mine,) = owned_kernel_modules()
        notes = root / "kernels" / "notes.txt"
        notes.write_text("my notes")
        edited = mine.parent / mine.name.replace(mine.stem[-20:], "0" * 20)  # named like ours, not ours
        edited.write_text("x = 2\n")
        warm = root / "autotune" / "warm"
        warm.mkdir()
        (warm / "plan.json").write_text(json.dumps({"plan": "p", "done": {}, "failed": {}}))
        (warm / "README").write_text("keep me")
        monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
        # prune --all is not a clear, and says so; clear without a terminal needs --yes
        assert main(["cache", "prune", "--all"]) == 0
        assert "cache clear" in capsys.readouterr().out and n_records(TuningCache(cache.path)) == 2
        assert main(["cache", "clear"]) == 2 and n_records(TuningCache(cache.path)) == 2
        assert main(["cache", "clear", "--dry-run"]) == 0
        assert "2 tuning records" in capsys.readouterr().out and mine.exists()
        assert main(["cache", "clear", "--yes"]) == 0
        out = capsys.readouterr().out
    assert "removed 2 tuning records, 1 kernel modules and 1 warm progress files" in out
    assert n_records(TuningCache(cache.path)) == 0 and cache.path.is_file(), "an empty cache, not no file"
    assert not mine.exists() and not (warm / "plan.json").exists()
    assert notes.read_text() == "my notes" and edited.read_text() == "x = 2\n"
    assert (warm / "README").read_text() == "keep me"
    # a file that is not a tuning cache is refused, untouched
    readme = tmp_path / "README.md"
    readme.write_text("# notes")
    assert main(["cache", "clear", "--yes", "--cache", str(readme)]) == 2
    assert readme.read_text() == "# notes"


# -- docs/metal.md: graphs reach the Metal grouped kernel -------------------------------------------
def test_a_graphs_grouped_mm_reaches_the_metal_grouped_kernel_on_mps():
    from tilewright.autotune.policy import policy_for
    from tilewright.compiler.capture import ModelSpec, capture_kernels
    from tilewright.grouped import GroupedGemmProblem
    from tilewright.runtime.targets import get_target

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 32, 16, dtype=torch.bfloat16))

        def forward(self, x, offs):
            return torch._grouped_mm(x, self.w, offs)

    x, offs = torch.randn(64, 32, dtype=torch.bfloat16), torch.tensor([16, 32, 48, 64], dtype=torch.int32)
    (cap,) = [c for c in capture_kernels(ModelSpec(Experts(), (x, offs))) if isinstance(c.problem, GroupedGemmProblem)]
    mps = get_target("mps")
    names = [c.template_id for c in policy_for("grouped_gemm", mps).candidates(cap.problem, mps)]
    assert "metal.grouped_gemm" in names and "aten.grouped_gemm" in names
