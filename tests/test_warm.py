"""The offline warmer: shapes files become the right problems, finished problems are never
redone (also after a SIGKILL), racing warmers lose no record, Ray merges into one cache, and a
warmed model compiles without benchmarking anything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tilewright
from fakes import FakeFactory

from tilewright.autotune.cache import ProblemKey, TuningCache
from tilewright.autotune.policy import policy_for
from tilewright.autotune.shapes import ShapesFileError, load_shapes, problems_from_shapes
from tilewright.autotune.warm import WarmError, expand_buckets, warm
from tilewright.problem import GemmProblem
from tilewright.runtime.targets import get_target

ROOT = Path(__file__).parents[1]
CPU = get_target("cpu")
TINY = {"m_decode": [1, 2, 4], "m_prefill": [16],
        "models": {"toy": {"up": {"N": 32, "K": 16}, "down": {"N": 16, "K": 32}},
                   "moe": {"experts": {"N": 16, "K": 16, "experts": 8, "top_k": 2, "grouped": True}}}}


@pytest.fixture
def shapes_file(tmp_path) -> Path:
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps(TINY))
    return path


def test_llm_shapes_file_becomes_problems():
    data = load_shapes(ROOT / "bench/cases/llm_gemm_shapes.json")
    probs = problems_from_shapes(data, models=["llama-3-8b"], phases=["decode"])
    assert len(probs) == 5 * 7
    p = next(x.problem for x in probs if x.name == "llama-3-8b.gate_up_proj.M16")
    assert (p.M, p.N, p.K, p.dtype, p.layout_b) == (16, 28672, 4096, "bf16", "col")


def test_grouped_layers_are_batched_by_a_uniform_router(shapes_file):
    probs = {p.name: p.problem for p in problems_from_shapes(load_shapes(shapes_file), models=["moe"])}
    one = probs["moe.experts.M1"]   # 1 token x top-2: two experts with one row each
    assert (one.batch, one.M, one.batched) == (2, 1, True)
    many = probs["moe.experts.M16"]  # 32 routed rows over all 8 experts
    assert (many.batch, many.M) == (8, 4)


def test_dynamic_m_marks_and_buckets(shapes_file):
    data = load_shapes(shapes_file)
    probs = problems_from_shapes(data, models=["toy"], m_values=[3, 4, 5], dynamic=["M"])
    assert sorted({p.problem.M for p in probs}) == [4, 8]
    assert all(p.problem.dynamic == frozenset({"M"}) for p in probs)


def test_dynamic_problems_expand_to_every_bucket():
    from tilewright.autotune.shapes import NamedProblem

    p = GemmProblem(M=100, N=64, K=32, dtype="fp32", dynamic=frozenset({"M"}))
    ms = [x.problem.M for x in expand_buckets([NamedProblem("p", p)])]
    assert ms == [1, 2, 4, 8, 16, 32, 64, 128]
    assert [x.problem.M for x in expand_buckets([NamedProblem("p", p)], max_m=8)] == [1, 2, 4, 8]


@pytest.mark.parametrize("content,match", [
    ("{oops", "not JSON"), ('{"models": {}}', "no \\\"models\\\""),
    ('{"models": {"m": {"l": {"N": 4}}}}', "integer"), ('{"models": {"m": {}}, "m_decode": [0]}', "positive"),
])
def test_bad_shapes_files_say_what_to_fix(tmp_path, content, match):
    path = tmp_path / "s.json"
    path.write_text(content)
    with pytest.raises(ShapesFileError, match=match):
        load_shapes(path)


def test_bad_selections_say_what_to_fix(shapes_file):
    data = load_shapes(shapes_file)
    for kw, match in [({"models": ["nope"]}, "unknown model"), ({"phases": ["train"]}, "unknown phase"),
                      ({"dtype": "int8"}, "dtype")]:
        with pytest.raises(ShapesFileError, match=match):
            problems_from_shapes(data, **kw)


@pytest.fixture
def several_candidates():
    """On the CPU only ATen competes unless generated kernels are forced (see the policy);
    forcing them gives every problem several candidates for the cache to remember."""
    with tilewright.config.patch(force_backend="triton"):
        yield


def test_warm_then_rerun_skips_everything(shapes_file, tmp_path, several_candidates):
    probs = problems_from_shapes(load_shapes(shapes_file), models=["toy"], dtype="fp32")
    cache = TuningCache(tmp_path / "c.json")
    first = warm(probs, CPU, FakeFactory(), cache=cache)
    assert first.tuned == 8 and first.skipped == 0 and first.measured > 8
    factory = FakeFactory()
    again = warm(probs, CPU, factory, cache=cache)
    assert again.skipped == 8 and again.tuned == 0 and factory.builds == []
    # a restart ignores the state, but the cache still answers: nothing is benchmarked
    redo = warm(probs, CPU, factory, cache=cache, restart=True)
    assert redo.tuned == 8 and redo.measured == 0 and factory.builds == []


def test_warm_trusts_the_cache_not_its_progress_file(shapes_file, tmp_path, several_candidates):
    """The progress file says every problem is done, but the records are gone (another cache
    file, as after a deletion, prune or quarantine): each problem is tuned again."""
    probs = problems_from_shapes(load_shapes(shapes_file), models=["toy"], dtype="fp32")
    state = tmp_path / "state.json"
    first = warm(probs, CPU, FakeFactory(), cache=TuningCache(tmp_path / "c.json"), state_path=state)
    assert first.tuned == 8
    again = warm(probs, CPU, FakeFactory(), cache=TuningCache(tmp_path / "empty.json"), state_path=state)
    assert again.tuned == 8 and again.skipped == 0 and again.measured > 8


def test_warming_a_remote_target_is_refused(shapes_file, tmp_path):
    probs = problems_from_shapes(load_shapes(shapes_file), models=["toy"])
    with pytest.raises(WarmError, match="not on this machine"):
        warm(probs, get_target("cuda:sm_90a"), FakeFactory(), cache=TuningCache(tmp_path / "c.json"))


# -- subprocesses: the CLI as a user runs it ------------------------------------------------------
def cli(args, env_extra, **kw):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", **env_extra}
    return subprocess.Popen([sys.executable, "-m", "tilewright", "warm", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def warm_args(shapes, cache, *extra):
    return [str(shapes), "--target", "cpu", "--dtype", "fp32", "--cache", str(cache),
            "--factory", "fakes:warm_factory", *extra]


def built_problems(log: Path) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.slow
def test_killed_warmer_resumes_without_redoing_finished_problems(shapes_file, tmp_path):
    cache, log = tmp_path / "c.json", tmp_path / "builds.log"
    args = warm_args(shapes_file, cache, "--models", "toy", "--phases", "decode")
    proc = cli(args, {"FAKE_BUILD_LOG": str(log), "FAKE_HANG_M": "4"})
    deadline = time.monotonic() + 120
    while "4x32x16" not in built_problems(log):  # toy.up.M4 hangs in its first build
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    first = built_problems(log)
    assert {"1x32x16", "2x32x16"} <= set(first) and "1x16x32" not in first
    log.unlink()
    proc = cli(args, {"FAKE_BUILD_LOG": str(log)})
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    again = set(built_problems(log))
    assert again == {"4x32x16", "1x16x32", "2x16x32", "4x16x32"}, "finished problems were redone"
    assert "4 tuned, 2 already done" in out


@pytest.mark.slow
def test_two_warmers_racing_on_one_cache_lose_no_record(shapes_file, tmp_path):
    cache = tmp_path / "shared.json"
    procs = [cli(warm_args(shapes_file, cache, "--models", models), {})
             for models in ("toy", "moe")]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
    tc = TuningCache(cache)
    probs = problems_from_shapes(load_shapes(shapes_file), dtype="fp32")
    for item in probs:
        want = {c.key for c in policy_for("gemm", CPU).candidates(item.problem, CPU)}
        assert set(tc.lookup(ProblemKey.for_problem(item.problem, "cpu"))) == want, item.name


@pytest.mark.slow
def test_warm_on_a_local_ray_cluster_merges_into_one_cache(shapes_file, tmp_path, monkeypatch,
                                                          several_candidates):
    ray = pytest.importorskip("ray")
    for k, v in {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
                 "RAY_USAGE_STATS_ENABLED": "0"}.items():
        monkeypatch.setenv(k, v)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}})
    try:
        probs = problems_from_shapes(load_shapes(shapes_file), dtype="fp32")
        cache = TuningCache(tmp_path / "c.json")
        report = warm(probs, CPU, FakeFactory(), cache=cache, use_ray=True)
        assert report.tuned == len(probs) and not report.failed
        for item in probs:
            assert len(cache.lookup(ProblemKey.for_problem(item.problem, "cpu"))) >= 1, item.name
        again = warm(probs, CPU, FakeFactory(), cache=cache, use_ray=True)
        assert again.skipped == len(probs) and again.measured == 0
    finally:
        ray.shutdown()


COMPILE_LLAMA = """
import json, torch
from tilewright.compiler.report import collect_reports
from tilewright.demo import models
m, (ids,) = models.llama_bf16_example()
with torch.no_grad(), collect_reports() as reports:
    torch.compile(m, backend="tilewright")(input_ids=ids)
cands = [c for g in reports for r in g.gemms for c in r.candidates]
print(json.dumps({"gemms": sum(len(g.gemms) for g in reports), "candidates": len(cands),
                  "measured": sum(not c.cached for c in cands)}))
"""


@pytest.mark.slow
def test_a_warmed_llama_compiles_without_benchmarking(tmp_path):
    env = {**os.environ, "TILEWRIGHT_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    w = subprocess.run([sys.executable, "-m", "tilewright", "warm",
                        "tilewright.demo.models:llama_bf16_example", "--target", "cpu"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert w.returncode == 0, w.stdout + w.stderr
    # its 5 GEMMs (epilogues are the loop kernels' on a CPU), 5 loop kernels and its attention
    assert "11 tuned" in w.stdout
    run = subprocess.run([sys.executable, "-c", COMPILE_LLAMA], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["gemms"] >= 8 and got["candidates"] >= got["gemms"]
    assert got["measured"] == 0, "the warmed cache must answer every candidate of every GEMM"


def test_bias_layers_warm_the_keys_a_linear_looks_up():
    """Regression: warming from a shapes file only wrote bias-free mm keys, which an
    nn.Linear(bias=True) never looks up."""
    import torch
    import torch.nn as nn

    from tilewright.compiler.capture import ModelSpec, capture_gemms

    captured = capture_gemms(ModelSpec(nn.Linear(384, 1536), (torch.randn(8, 384),)))[0].problem
    data = load_shapes(ROOT / "bench/cases/llm_gemm_shapes.json")
    plain = problems_from_shapes(data, models=["all-minilm-l6-v2"], m_values=[8], dtype="fp32")
    biased = problems_from_shapes(data, models=["all-minilm-l6-v2"], m_values=[8], dtype="fp32", bias=True)
    assert captured not in [p.problem for p in plain]
    assert captured in [p.problem for p in biased]


def test_warming_a_model_includes_its_loop_kernels_at_the_buckets_it_looks_up():
    import argparse

    from tilewright.autotune.buckets import bucket_problem
    from tilewright.cli.warm import gather_problems
    from tilewright.problem import LoopProblem

    args = argparse.Namespace(shapes="tilewright.demo.models:llama_bf16_example", train=False)
    items = gather_problems(args)
    loops = [i for i in items if isinstance(i.problem, LoopProblem)]
    assert loops and any(".reduction." in i.name for i in loops)
    for i in loops:
        assert i.problem == bucket_problem(i.problem, dict(i.problem.sizes))
