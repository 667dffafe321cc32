"""The perf gate: ``bench run`` of the tiny suite works on the CPU and records what a gate
needs; ``bench compare`` fails on a 10% regression, passes on noise-level differences, refuses
a baseline from another arch, and writes HTML/PNG reports."""

from __future__ import annotations

import copy
import json
import random

import pytest

from tilewright.cli.main import main
from tilewright.perf.compare import CompareError, compare, load_results, parse_percent
from tilewright.perf.run import FORMAT
from tilewright.perf.suites import UnknownSuiteError, suite_problems


def results(ms: dict[str, float], spread_pct: float = 0.5, target: str = "cuda:sm_90a") -> dict:
    """A synthetic results document: tilewright at ``ms``, ATen 10% slower."""
    rows = []
    for name, t in ms.items():
        rows.append({"id": name, "choice": "triton.gemm[128x128x64 g8 w4 s3]",
                     "impls": {"tilewright": {"ms": t, "spread_ms": t * spread_pct / 100},
                               "aten": {"ms": t * 1.1, "spread_ms": t * spread_pct / 100}},
                     "speedup_vs_aten": 1.1})
    return {"format": FORMAT, "suite": "llm-decode", "results": rows,
            "env": {"target": target, "arch": target.split(":")[-1], "device": "NVIDIA H200",
                    "versions": {"torch": "2.11.0", "triton": "3.6.0", "tilewright": "0.1.0"}}}


BASE_MS = {f"llama-3-8b.{layer}.M{m}": 0.01 * (i + 1) * m
           for i, layer in enumerate(("qkv_proj", "o_proj", "down_proj")) for m in (1, 16, 64)}


def scaled(doc: dict, factor: dict[str, float]) -> dict:
    out = copy.deepcopy(doc)
    for r in out["results"]:
        f = factor.get(r["id"], 1.0)
        for impl in r["impls"].values():
            impl["ms"] *= f
    return out


def test_a_ten_percent_regression_fails_the_gate():
    base = results(BASE_MS)
    new = scaled(base, {"llama-3-8b.o_proj.M16": 1.10})
    cmp = compare(base, new, max_regression=0.03)
    assert not cmp.passed and cmp.count("regression") == 1
    assert next(r for r in cmp.rows if r.verdict == "regression").id == "llama-3-8b.o_proj.M16"


def test_noise_level_differences_pass():
    base = results(BASE_MS)
    rng = random.Random(0)
    new = scaled(base, {k: 1 + rng.uniform(-0.01, 0.01) for k in BASE_MS})
    assert compare(base, new, max_regression=0.03).passed


def test_a_change_inside_a_wide_spread_is_noise_not_a_regression():
    base = results(BASE_MS, spread_pct=4.0)
    new = scaled(base, {"llama-3-8b.qkv_proj.M1": 1.05})
    cmp = compare(base, new, max_regression=0.03)
    assert cmp.passed and cmp.count("noisy") == 1


def test_missing_problems_fail_unless_allowed():
    base = results(BASE_MS)
    new = copy.deepcopy(base)
    new["results"] = new["results"][1:]
    assert not compare(base, new).passed
    assert compare(base, new, allow_missing=True).passed


def test_a_baseline_from_another_arch_is_refused():
    with pytest.raises(CompareError, match="bench/baselines/cpu/llm-decode.json"):
        compare(results(BASE_MS), results(BASE_MS, target="cpu"))


def test_baselines_resolve_per_arch(tmp_path):
    folder = tmp_path / "baselines"
    (folder / "sm_90a").mkdir(parents=True)
    (folder / "sm_90a" / "llm-decode.json").write_text(json.dumps(results(BASE_MS)))
    assert load_results(folder, suite="llm-decode", arch="sm_90a")["suite"] == "llm-decode"
    with pytest.raises(CompareError, match="no baseline for suite 'llm-decode' on gfx950"):
        load_results(folder, suite="llm-decode", arch="gfx950")
    (tmp_path / "junk.json").write_text('{"format": "other"}')
    with pytest.raises(CompareError, match="not a tilewright-bench/1 results file"):
        load_results(tmp_path / "junk.json")


def test_cli_compare_exit_codes_and_reports(tmp_path, capsys):
    base, bad = tmp_path / "base.json", tmp_path / "bad.json"
    doc = results(BASE_MS)
    base.write_text(json.dumps(doc))
    bad.write_text(json.dumps(scaled(doc, {"llama-3-8b.down_proj.M64": 1.10})))
    html, png = tmp_path / "r.html", tmp_path / "r.png"
    assert main(["bench", "compare", str(base), str(base), "--max-regression", "3%"]) == 0
    assert main(["bench", "compare", str(base), str(bad), "--max-regression", "3%",
                 "--html", str(html), "--png", str(png)]) == 1
    out = capsys.readouterr().out
    assert "FAIL: regression 1" in out and "llama-3-8b.down_proj.M64" in out
    assert "[/]" not in out and "[red]" not in out, "the verdict column printed raw markup"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = html.read_text()
    assert "FAIL" in page and 'class="regression"' in page and "data:image/png;base64," in page
    assert main(["bench", "compare", str(base), str(bad), "--max-regression", "15%"]) == 0


def test_percent_and_suite_errors():
    assert parse_percent("3%") == pytest.approx(0.03) and parse_percent("10") == pytest.approx(0.1)
    with pytest.raises(ValueError):
        parse_percent("-1%")
    with pytest.raises(UnknownSuiteError, match="choose from tiny"):
        suite_problems("nope")
    assert len(suite_problems("h200-check")) == 9 * 5
    assert all(p.problem.dtype == "bf16" for p in suite_problems("llm-decode"))


def test_bench_run_tiny_on_cpu(tmp_path, fresh_cache, capsys):
    out = tmp_path / "r.json"
    assert main(["bench", "run", "--suite", "tiny", "--out", str(out)]) == 0
    doc = load_results(out)
    assert doc["complete"] and doc["env"]["target"] == "cpu" and doc["env"]["versions"]["torch"]
    assert len(doc["results"]) == 4
    for r in doc["results"]:
        for impl in ("tilewright", "aten"):
            m = r["impls"][impl]
            assert m["ms"] > 0 and m["spread_ms"] >= 0 and m["tflops"] > 0 and m["gbps"] > 0
            assert m["rel_err"] < 1e-4, (r["id"], impl)
        assert r["choice"] and r["speedup_vs_aten"] > 0
    printed = capsys.readouterr().out
    assert "tiny.32x64x48.col" in printed
    lo = doc["launch_overhead_us"]
    assert set(lo) == {"python_call", "static", "dynamic", "inductor_reference"}
    assert all(v > 0 for v in lo.values()) and "wrapper cost per kernel call" in printed
    assert main(["bench", "compare", str(out), str(out)]) == 0, "a run never regresses on itself"


def test_null_kernel_call_returns_its_output_through_both_dispatch_paths():
    from tilewright.compiler.dispatch import KernelCall
    from tilewright.perf.launch import _null_problem
    from tilewright.runtime.targets import get_target

    seen = []
    for dynamic in (False, True):
        problem = _null_problem(dynamic)
        call = KernelCall("null", problem, get_target("cpu"), factory=None)
        call.bind(problem, lambda *args, outs=None: (seen.append(args) or ("out",)))
        assert call(*(("x", 1000) if dynamic else ("x",))) == "out"
    assert seen == [("x",), ("x", 1000)]


@pytest.mark.slow
def test_device_check_script_dry_run(tmp_path):
    """bench/device_check.sh runs every step on the CPU (GPU tests skipped, tiny suite) and ends
    with the table."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    env = {**os.environ, "PYTHON": sys.executable, "TILEWRIGHT_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(["bash", str(root / "bench/device_check.sh"), str(tmp_path / "out"),
                           "--dry-run"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    assert {"env.json", "gpu_tests.log", "bench.json", "summary.json"} <= {p.name for p in out.iterdir()}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rc"] == {"tests": 0, "bench": 0, "gate": 0} and summary["gpu_tests"]["tests"] > 0
    assert load_results(out / "bench.json")["complete"]
    assert proc.stdout.rstrip().splitlines()[-1].startswith("└"), "the table must come last"
