"""Programmatic dependent launch (PDL) end to end: the Triton templates' ``PDL`` knob (wait before
the first global access, release once the inputs are read, ``launch_pdl``), the per-edge decision
of a compiled graph (``compiler/pdl.py``), the AOT builds' griddepcontrol instructions, and on a
GPU the graph run with PDL on and the pairs timed under ``auto``."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from tilewright._config import config
from tilewright.autotune.candidates import Candidate
from tilewright.compiler import pdl
from tilewright.compiler.capture import ModelSpec, aten_graphs
from tilewright.compiler.lower import lower
from tilewright.compiler.pipeline import fuse
from tilewright.problem import GemmProblem
from tilewright.runtime import cutedsl as runtime_cutedsl
from tilewright.templates.triton import pdl as runtime_pdl
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

BF16 = GemmProblem(48, 256, 512, "bf16", layout_b="col")
NVFP4 = GemmProblem(8, 256, 512, "nvfp4", layout_b="col", scale_layout="row")
SM90, SM100 = get_target("cuda:sm_90a"), get_target("cuda:sm_100a")
needs_gdc = pytest.mark.skipif(runtime_pdl.triton_pdl_refusal(SM90) is not None,
                               reason=str(runtime_pdl.triton_pdl_refusal(SM90)))


def candidate(template_id: str, problem, target, **params) -> Candidate:
    t = get_template(template_id)
    return Candidate.of(t.id, t.source_hash, t.space.complete(params))


# -- the templates ---------------------------------------------------------------------------------
GEMMS = [("triton.gemm", BF16, {}), ("triton.gemm", BF16, {"SPLIT_K": 2, "SWAP_AB": True, "BLOCK_K": 64}),
         ("triton.gemm_tma", BF16, {}), ("triton.gemm_nvfp4", NVFP4, {"SWAP_AB": True, "BLOCK_K": 64}),
         ("triton.gemm_nvfp4", NVFP4, {"SPLIT_K": 2, "BLOCK_K": 64})]


@needs_gdc
@pytest.mark.parametrize("template_id,problem,params", GEMMS)
def test_pdl_gemm_waits_before_its_first_access_and_launches_with_pdl(template_id, problem, params):
    t = get_template(template_id)
    params = t.space.complete({**params, "PDL": True})
    assert t.check(params, problem, SM90) is None
    src = t.render(problem, params, SM90).source
    for kernel in re.split(r"\n@triton\.jit\n", src)[1:]:  # each jitted function with a load
        if "tl.load" not in kernel and "desc.load" not in kernel:
            continue
        body = kernel.split("):\n", 1)[1]
        first_access = min(i for i in (body.find("tl.load"), body.find("make_tensor_descriptor"),
                                       body.find("tl.store")) if i >= 0)
        assert 0 <= body.find("gdc_wait()") < first_access, kernel[:400]
        assert "gdc_launch_dependents()" in body
    launches = re.findall(r"(?m)^\s+tw_\w+\[.*\]\($", src)  # every kernel launch in the launcher
    assert launches and src.count("launch_pdl=True") == len(launches)
    plain = t.render(problem, t.space.complete(params | {"PDL": False}), SM90).source
    assert "gdc_" not in plain and "launch_pdl" not in plain


def test_pdl_is_refused_where_it_cannot_run(monkeypatch):
    t = get_template("triton.gemm")
    on = t.space.complete({"PDL": True})
    assert "interpreter" in t.check(on, BF16, get_target("cpu"))
    assert "no programmatic dependent launch" in t.check(on, BF16, get_target("hip:gfx950"))
    assert "no programmatic dependent launch" in t.check(on, BF16, get_target("cuda:sm_80"))
    with config.patch(pdl="off"):
        assert "TILEWRIGHT_PDL=off" in t.check(on, BF16, SM90)
    monkeypatch.setattr(runtime_pdl, "triton_launch_pdl", lambda: False)
    assert "launch_pdl" in t.check(on, BF16, SM90)


@needs_gdc
def test_pdl_loop_kernel_releases_before_its_first_store():
    kg, _ = graph_of(Mlp().eval(), torch.randn(4, 64))
    fused = [n for n in kg.fused]
    assert fused
    for f in fused:
        t = get_template(f"triton.{f.problem.kind}")
        params = t.space.complete({"PDL": True})
        src = t.render(f.problem, params, SM100).source
        body = src.split("):\n", 1)[1].split("\ndef launch", 1)[0]
        assert body.find("gdc_wait()") < body.find("tl.load(")
        assert body.find("gdc_launch_dependents()") < body.find("tl.store(")
        assert "launch_pdl=True" in src


# -- the edges of a graph -----------------------------------------------------------------------------
class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(64, 128), nn.Linear(128, 64)

    def forward(self, x):
        h = self.up(x)
        h = h * torch.sigmoid(h.sum(-1, keepdim=True))  # a reduction between the GEMMs
        return self.down(h)


def graph_of(model, *args):
    graphs = aten_graphs(ModelSpec(model, args))
    gm = graphs["inference"]
    kg = lower(gm)
    fuse(kg, gm)
    return kg, gm


def test_chain_edges_follow_launch_order_and_views_do_not_break_them():
    kg, _ = graph_of(Mlp().eval(), torch.randn(4, 64))
    edges = pdl.chain_edges(kg.nodes)
    kernels = [n.name for n in kg.nodes if type(n).__name__ in ("GemmNode", "FusedNode")]
    assert len(kernels) >= 3
    assert edges and all(kernels.index(c) == kernels.index(p) + 1 for p, c in edges)
    assert pdl.chained(kg) == {name for e in edges for name in e}


def test_edge_decisions_per_mode():
    chosen = {"a": (BF16, candidate("triton.gemm", BF16, SM90)),
              "b": (BF16, candidate("triton.gemm_tma", BF16, SM90)),
              "c": (BF16, Candidate.of("aten.gemm", get_template("aten.gemm").source_hash))}
    targets = dict.fromkeys(chosen, SM90)
    edges = [("a", "b"), ("b", "c")]
    if runtime_pdl.triton_pdl_refusal(SM90) is None:
        on = pdl.decide(edges, chosen, targets, mode="on")
        assert [d.on for d in on] == [True, False] and "has no PDL" in on[1].reason
        assert pdl.pdl_kernels(on) == {"a", "b"}
        faster = pdl.decide(edges, chosen, targets, mode="auto", measure=lambda p, c, t: (10.0, 8.0, 0.5))
        assert faster[0].on and faster[0].pdl_ms == 8.0
        slower = pdl.decide(edges, chosen, targets, mode="auto", measure=lambda p, c, t: (10.0, 9.8, 0.5))
        assert not slower[0].on and "no faster" in slower[0].reason
        blind = pdl.decide(edges, chosen, targets, mode="auto", measure=None)
        assert not blind[0].on and "nothing to measure" in blind[0].reason
    assert not any(d.on for d in pdl.decide(edges, chosen, targets, mode="off"))
    cpu = pdl.decide([("a", "b")], chosen, dict.fromkeys(chosen, get_target("cpu")), mode="on")
    assert not cpu[0].on and "interpreter" in cpu[0].reason


def test_compiled_graph_on_cpu_reports_why_no_edge_overlaps():
    from tilewright.compiler.report import collect_reports as collect

    torch._dynamo.reset()
    with collect() as reports, config.patch(force_backend="triton", autotune=False):
        torch.compile(Mlp().eval(), backend="tilewright")(torch.randn(4, 64))
    edges = [e for r in reports for e in r.pdl_edges]
    assert edges and not any(e["on"] for e in edges)
    assert all("interpreter" in e["reason"] for e in edges)


# -- ahead of time: the instructions ---------------------------------------------------------------------
@needs_gdc
@pytest.mark.slow
def test_aot_pdl_kernels_contain_griddepcontrol_and_others_do_not(tmp_path):
    from tilewright.runtime.aot import CompileJob, compile_jobs
    from tilewright.runtime.verify import verify

    cases = []
    for target in (SM90, SM100):
        for template_id, problem, params in GEMMS[:1] + GEMMS[3:4]:
            t = get_template(template_id)
            for on in (False, True):
                # a tile the register check accepts on both chips (16x32 with one warp)
                p = t.space.complete({**params, "PDL": on, "BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 1})
                cases.append((t, problem, p, target, f"{target.arch}-{template_id}-{on}"))
    jobs = [CompileJob(name.replace(".", "_"), t.render(pr, p, tg).source, t.render(pr, p, tg).aot.to_json(), tg.triton)
            for t, pr, p, tg, name in cases]
    results = compile_jobs(jobs, tmp_path, workers=2)
    for (t, pr, p, tg, name), r in zip(cases, results):
        assert r.ok, (name, r.error[-500:])
        arts = {k: tmp_path / v for k, v in r.artifacts.items()}
        checks = t.expected_instructions(pr, p, tg)
        v = verify(arts, checks)
        assert v.ok, (name, v.failures)
        ptx = arts["ptx"].read_text()
        assert ("griddepcontrol.wait" in ptx) == p["PDL"], name


@pytest.mark.slow
def test_aot_nvfp4_decode_chains_block_scaled_producers_into_triton_consumers(tmp_path):
    """The issue's bar: ``tilewright aot`` of an NVFP4 decode model for sm_100a holds Triton
    consumers with griddepcontrol.wait after block-scaled producers with launch_dependents,
    and swap-AB block-scaled kernels for M <= 16. The same build (for sm_90a and gfx950 too)
    is the NVFP4 half of "the demo models' AOT builds choose no spilling kernel" (the dense
    Llama's is tests/test_aot.py's CLI build)."""
    if runtime_pdl.triton_pdl_refusal(SM100) is not None:
        pytest.skip(runtime_pdl.triton_pdl_refusal(SM100))
    out = subprocess.run(
        [sys.executable, "-m", "tilewright", "aot", "tilewright.demo.models:llama_nvfp4_decode",
         "--target", "sm_90a,sm_100a,gfx950", "--out", str(tmp_path)], capture_output=True, text=True,
        timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    everything = manifest["kernels"]
    assert all(k["status"] in ("built", "cached") and k["verify"]["ok"] for k in everything)
    # registers: read from nearly every artifact, no kernel chosen that spills, on any target
    assert manifest["summary"]["spilling"] == 0
    read = [k for k in everything if k["resources"] is not None]
    assert len(read) >= 0.9 * len(everything)
    assert not [k["name"] for k in read if k["resources"]["spills"]]
    kernels = [k for k in everything if k["target"] == SM100.name]

    def ptx(k):
        return (tmp_path / "kernels" / k["artifacts"]["ptx"]).read_text()

    # the block-scaled MMA template needs triton >= 3.9 (it says so, and is refused under 3.6)
    nvfp4_templates = {t for t in ("triton.gemm_nvfp4", "triton.gemm_nvfp4_mma")
                       if get_template(t).supports(NVFP4, SM100)}
    assert "triton.gemm_nvfp4" in nvfp4_templates
    producers = [k for k in kernels if k["problem"].get("dtype") == "nvfp4" and k["params"].get("PDL")]
    assert {k["template"] for k in producers} >= nvfp4_templates
    assert all("griddepcontrol.launch_dependents" in ptx(k) for k in producers)
    consumers = [k for k in kernels if k["kind"] in ("pointwise", "reduction") and k["params"].get("PDL")]
    assert consumers and all("griddepcontrol.wait" in ptx(k) for k in consumers)
    swapped = [k for k in kernels if k["problem"].get("dtype") == "nvfp4" and k["params"].get("SWAP_AB")
               and k["problem"]["M"] <= 16]
    assert {k["template"] for k in swapped} >= nvfp4_templates
    if runtime_cutedsl.available():  # the CuTeDSL block-scaled template swaps too
        assert "cutedsl.blockscaled_sm100" in {k["template"] for k in swapped}
    mma = [k for k in swapped if k["template"] in ("triton.gemm_nvfp4_mma", "cutedsl.blockscaled_sm100")]
    assert all(re.search(r"tcgen05\.mma\S*kind::mxf4nvf4\.block_scale", ptx(k)) for k in mma)


# -- on a GPU --------------------------------------------------------------------------------------------
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
def test_gpu_graph_with_pdl_matches_eager_and_launches_with_pdl():
    from tilewright.compiler.report import collect_reports as collect

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90 or later")
    torch.manual_seed(0)
    model = Mlp().cuda().to(torch.bfloat16).eval()
    x = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    ref = model.double()(x.double()).float()
    model = model.to(torch.bfloat16)
    torch._dynamo.reset()
    with collect() as reports, config.patch(pdl="on", force_backend="triton"), torch.no_grad():
        out = torch.compile(model, backend="tilewright")(x)
    edges = [e for r in reports for e in r.pdl_edges]
    assert any(e["on"] for e in edges), edges
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 2e-2, err


@pytest.mark.gpu
@gpu
def test_gpu_pdl_pair_is_measured_under_auto():
    from tilewright.autotune.pdl_pairs import measure_pair

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90 or later")
    target = get_target(f"cuda:sm_{''.join(map(str, torch.cuda.get_device_capability()))}a")
    p = (BF16, candidate("triton.gemm", BF16, target, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4))
    plain, with_pdl, noise = measure_pair(p, p, target)
    assert plain > 0 and with_pdl > 0 and noise >= 0


def test_fused_quantising_producer_is_the_nvfp4_gemms_pdl_producer():
    """A calibrated NVFP4 decode step: the norm (or SwiGLU) kernel that writes the packed
    activation and its block scales launches right before the NVFP4 GEMM reading them (no ATen
    quantisation between them breaks the chain), so it is the producer of a PDL edge, and its
    Triton rendering for sm_100a waits, releases, and stores the E4M3 scales."""
    from tilewright.compiler.graph import FusedNode
    from tilewright.kinds.gemm.node import GemmNode
    from tilewright.demo.models import llama_nvfp4_decode_calibrated

    model, inputs = llama_nvfp4_decode_calibrated(tokens=4)
    kg, _ = graph_of(model, *inputs)
    by_name = {n.name: n for n in kg.nodes}
    edges = [(by_name[p], by_name[c]) for p, c in pdl.chain_edges(kg.nodes)]
    quantising = [(p, c) for p, c in edges if isinstance(p, FusedNode) and isinstance(c, GemmNode)
                  and c.fmt == "nvfp4" and c.a in p.outputs
                  and any(b.dtype == "fp8e4m3" for b in p.problem.kernel.outputs)]
    assert len(quantising) >= 2, [(p.name, c.name) for p, c in edges]
    assert not [n for n in kg.nodes if "nvfp4_quantize" in str(getattr(getattr(n, "fx_node", None), "target", ""))]
    producer = quantising[0][0].problem
    t = get_template(f"triton.{producer.kind}")
    assert t.supports(producer, SM100), t.supports(producer, SM100).reason
    if runtime_pdl.triton_pdl_refusal(SM100) is None:
        params = t.space.complete({"PDL": True})
        assert t.check(params, producer, SM100) is None
        src = t.render(producer, params, SM100).source
        assert "gdc_wait()" in src and "gdc_launch_dependents()" in src, src[:3000]
        assert "float8e4nv" in src or "fp8e4nv" in src


@pytest.mark.slow
def test_fused_mx_quantising_producer_is_the_mx_gemms_pdl_producer():
    """An MXFP4 decode step (no calibration: MX scales are per block): the norm or SwiGLU
    kernel that writes the packed activation and its E8M0 scale bytes (compiler/loops/
    quantize_mx.py) launches right before the MX GEMM reading them, so it is the producer of a
    PDL edge, and its Triton rendering for sm_100a waits and releases."""
    from tilewright.compiler.graph import FusedNode
    from tilewright.kinds.gemm.node import GemmNode
    from tilewright.demo.models import build_llama, llama_inputs
    from tilewright.quant.linear import quantize_linears

    model = build_llama(torch.bfloat16).eval()
    quantize_linears(model, fmt="mxfp4", skip=("lm_head",))
    kg, _ = graph_of(model, llama_inputs(batch=4, seq=1))
    by_name = {n.name: n for n in kg.nodes}
    edges = [(by_name[p], by_name[c]) for p, c in pdl.chain_edges(kg.nodes)]
    quantising = [(p, c) for p, c in edges if isinstance(p, FusedNode) and isinstance(c, GemmNode)
                  and c.fmt == "mxfp4" and c.a in p.outputs
                  and any(b.dtype == "u8" for b in p.problem.kernel.outputs)]
    assert len(quantising) >= 2, [(p.name, c.name) for p, c in edges]
    assert not [n for n in kg.nodes if "mx_quantize" in str(getattr(getattr(n, "fx_node", None), "target", ""))]
    producer = quantising[0][0].problem
    t = get_template(f"triton.{producer.kind}")
    assert t.supports(producer, SM100), t.supports(producer, SM100).reason
    if runtime_pdl.triton_pdl_refusal(SM100) is None:
        params = t.space.complete({"PDL": True})
        assert t.check(params, producer, SM100) is None
        src = t.render(producer, params, SM100).source
        assert "gdc_wait()" in src and "gdc_launch_dependents()" in src, src[:3000]
