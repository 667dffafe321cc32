"""A whole model on the SYCL backend: ``config.cpu_target = "xpu"`` compiles CPU tensors' kernels
for the ``xpu:opencl-cpu`` target, whose SYCL templates run on the OpenCL CPU device of the
``sycl`` extra. The demo's Llama decoder (2 layers, hidden 128; 1x8 tokens to keep the SYCL
builds few) is compiled with ``force_backend="sycl"`` and one candidate per problem, and one
training step (forward, loss, backward) is compared with eager by ‖out − ref‖ / ‖ref‖ at the
fp32 bound (1e-4); the reports say which GEMMs and loop kernels ran as SYCL. Under
``force_backend="auto"`` ATen and SYCL candidates are both checked and timed there, and the
faster wins.

~20 SYCL builds (~2.5 s each on 2 cores): the compiled model is built once per module and
shared by the asserts. Skipped, with the reason, without the SYCL runtime.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch

import tilewright
from conftest import TOL, rel_err
from loop_check import strided_refusal
from tilewright.compiler import pipeline
from tilewright.compiler.report import collect_reports
from tilewright.runtime import sycl as runtime
from tilewright.runtime.targets import get_target

MISSING = runtime.unavailable_reason()
needs_sycl = pytest.mark.skipif(MISSING is not None, reason=f"SYCL runtime unavailable: {MISSING}")
SYCL_CPU = get_target("xpu:opencl-cpu")


@pytest.fixture(scope="module", autouse=True)
def _device_first():
    """Start the SYCL device under the session's cache, before a test's ``fresh_cache`` would
    make the shim build again (~8 s) in its empty folder."""
    if MISSING is None:
        runtime.device()


def test_cpu_target_maps_the_cpu_to_the_sycl_cpu_target_only_when_asked(monkeypatch, caplog):
    cpu = get_target("cpu")
    assert pipeline.cpu_target(cpu) is cpu  # the default: "cpu"
    assert pipeline.cpu_target(get_target("xpu")) is get_target("xpu")  # other targets untouched
    with tilewright.config.patch(cpu_target="xpu"):
        if MISSING is None:
            assert pipeline.cpu_target(cpu) is SYCL_CPU
        # no SYCL runtime: one warning naming the fix, and the cpu target (ATen)
        monkeypatch.setattr(runtime, "unavailable_reason", lambda: "no SYCL here: pip install 'tilewright[sycl]'")
        pipeline._unknown_warned.discard("no SYCL here: pip install 'tilewright[sycl]'")
        with caplog.at_level(logging.WARNING, logger="tilewright.compiler"):
            assert pipeline.cpu_target(cpu) is cpu
            assert pipeline.cpu_target(cpu) is cpu
        lines = [r.getMessage() for r in caplog.records if "cpu_target='xpu'" in r.getMessage()]
        assert len(lines) == 1 and "pip install 'tilewright[sycl]'" in lines[0], lines


def test_the_setting_refuses_other_values():
    from tilewright.errors import ConfigError

    with pytest.raises(ConfigError, match="TILEWRIGHT_CPU_TARGET"):
        with tilewright.config.patch(cpu_target="sycl"):
            pass


@needs_sycl
def test_the_sycl_cpu_target_is_measured_here_aten_and_sycl_side_by_side(fresh_cache):
    from tilewright.autotune.select import _measurable, local_devices, select
    from tilewright.compiler.kernel_factory import default_factory
    from tilewright.problem import GemmProblem

    assert _measurable(SYCL_CPU) == torch.device("cpu") and local_devices(SYCL_CPU) == ["cpu"]
    assert _measurable(get_target("xpu")) is None  # the Intel GPU target is not this machine
    sel = select(GemmProblem(M=8, N=64, K=32, dtype="fp32"), SYCL_CPU, default_factory)
    assert sel.measured
    by_backend = {r.candidate.backend: r.record for r in sel.results}
    assert set(by_backend) == {"aten", "sycl"}
    for rec in by_backend.values():  # both checked against float64 and timed (aborted: too slow)
        assert rec.status in ("ok", "aborted") and rec.median_ms is not None, rec
        assert rec.rel_err is not None and rec.rel_err <= TOL[torch.float32]
    winner = next(r.record for r in sel.results if r.candidate == sel.winner)
    assert winner.median_ms <= min(r.median_ms for r in by_backend.values()) * 1.5 + 0.01, sel.reason


@pytest.fixture(scope="module")
def llama_step():
    """One training step of the demo's Llama decoder, eager and compiled for SYCL on the CPU."""
    if MISSING is not None:
        pytest.skip(f"SYCL runtime unavailable: {MISSING}")
    from tilewright.demo import models

    torch._dynamo.reset()
    eager = models.build_llama(torch.float32)
    model = copy.deepcopy(eager)
    ids = models.llama_inputs(batch=1, seq=8)
    ref = eager(input_ids=ids, labels=ids)
    ref.loss.backward()
    with tilewright.config.patch(cpu_target="xpu", force_backend="sycl", max_candidates=1, strict=True), \
            collect_reports() as graphs:
        out = torch.compile(model, backend="tilewright")(input_ids=ids, labels=ids)
        out.loss.backward()
    torch._dynamo.reset()
    return eager, model, ref, out, list(graphs)


@needs_sycl
def test_llama_gemms_and_loop_kernels_run_as_sycl(llama_step):
    *_, graphs = llama_step
    assert [g.kind for g in graphs] == ["forward", "backward"] and not any(g.fallback for g in graphs)
    gemms = [r for g in graphs for r in g.gemms]
    # attention has no SYCL template: it runs on ATen there (docs/attention.md)
    attention = [k for g in graphs for k in g.kernels if k.kind == "attention"]
    assert attention and all(k.winner == "aten.attention" for k in attention)
    # nor scans and scatters (the embedding's backward): refused with a reason, run on ATen
    kernels = [k for g in graphs for k in g.kernels if not strided_refusal(k)]
    sycl_gemms = [r for r in gemms if r.winner.startswith("sycl.gemm")]
    # every GEMM, those that also store their product for the backward (the training forward's
    # gate projections, store_acc) included
    others = [(r.node, r.reason) for r in gemms if r not in sycl_gemms]
    assert not others and len(sycl_gemms) >= 40, (len(sycl_gemms), others)
    assert kernels and all(k.winner.startswith("sycl.") for k in kernels), \
        [(k.node, k.winner, k.reason) for k in kernels if not k.winner.startswith("sycl.")]
    assert {k.kind for k in kernels} == {"pointwise", "reduction"}


@needs_sycl
def test_llama_forward_matches_eager(llama_step):
    _, _, ref, out, _ = llama_step
    assert rel_err(out.logits, ref.logits) <= TOL[torch.float32]
    assert rel_err(out.loss, ref.loss) <= TOL[torch.float32]


@needs_sycl
def test_llama_training_step_gradients_match_eager(llama_step):
    eager, model, *_ = llama_step
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert p.grad is not None, name
        worst = max(worst, rel_err(p.grad, q.grad))
    assert worst <= TOL[torch.float32], worst


# -- tilewright aot --target xpu: sources, launchers, the runtime's SPIR-V, a manifest ---------
class _Block(torch.nn.Module):
    """RMSNorm, a linear, SiLU and a softmax: a GEMM and reduction loop kernels."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.RMSNorm(64)
        self.proj = torch.nn.Linear(64, 96)

    def forward(self, x):
        h = torch.nn.functional.silu(self.proj(self.norm(x)))
        return h.softmax(-1) * 2.0 + x.sum(-1, keepdim=True)


@needs_sycl
def test_aot_for_xpu_writes_sources_spirv_and_a_manifest(tmp_path):
    import json

    from tilewright.compiler import aot
    from tilewright.compiler.aot_sycl import SPIRV_MAGIC
    from tilewright.compiler.capture import ModelSpec

    torch.manual_seed(0)
    spec = ModelSpec(_Block(), (torch.randn(2, 8, 64),), name="block")
    report = aot.build(spec, ["xpu"], tmp_path)
    assert report.ok and report.kernels and not report.refused
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["targets"] == ["xpu"] and {k["kind"] for k in manifest["kernels"]} >= {"gemm", "reduction"}
    for k in manifest["kernels"]:
        assert k["template"].startswith("sycl.") and k["status"] == "built", k
        cpp = (tmp_path / "kernels" / k["artifacts"]["cpp"]).read_text()
        assert 'extern "C"' in cpp and "nd_range_kernel" in cpp and k["metadata"]["kernel"] in cpp
        assert "_sycl.kernel(SOURCE, KERNEL)" in (tmp_path / "kernels" / k["artifacts"]["py"]).read_text()
        spv = (tmp_path / "kernels" / k["artifacts"]["spv"]).read_bytes()
        assert int.from_bytes(spv[:4], "little") == SPIRV_MAGIC and k["metadata"]["spirv"] is True
    for k in report.kernels:  # the CLI's table shows SYCL's knobs (its AOT writer describes them)
        assert aot.describe_params(k.params, k.template) == (
            f"wg{k.params['WG']}" if "WG" in k.params else "{BLOCK_M}x{BLOCK_N}x{BLOCK_K} t{THREAD_M}x{THREAD_N}".format(**k.params))
    again = aot.build(spec, ["xpu"], tmp_path)
    assert {k.result.status for k in again.kernels} == {"cached"}


# -- tilewright bench: SYCL's own time beside ATen's on this CPU ---------------------------------
@needs_sycl
def test_bench_sycl_cpu_suite_times_sycl_beside_aten(fresh_cache, capsys):
    from tilewright.cli.bench import results_table
    from tilewright.cli.common import console
    from tilewright.compiler.kernel_factory import default_factory
    from tilewright.perf.run import run_suite
    from tilewright.perf.suites import SUITE_TARGETS, suite_problems

    assert SUITE_TARGETS["sycl-cpu"] == SYCL_CPU.name
    problems = suite_problems("sycl-cpu")[:1]  # 8x128x128: ATen and 1-2 SYCL tiles
    doc = run_suite("sycl-cpu", problems, SYCL_CPU, default_factory)
    (row,) = doc["results"]
    assert doc["env"]["target"] == SYCL_CPU.name and row["sycl_candidate"].startswith("sycl.gemm")
    for impl in ("tilewright", "aten", "sycl"):
        m = row["impls"][impl]
        assert m["ms"] > 0 and m["rel_err"] < TOL[torch.float32], (impl, m)
    assert row["sycl_speedup_vs_aten"] == pytest.approx(row["impls"]["aten"]["ms"] / row["impls"]["sycl"]["ms"])
    console.print(results_table(doc))
    printed = capsys.readouterr().out
    assert "SYCL ms" in printed and "sycl-cpu.8x128x128" in printed
