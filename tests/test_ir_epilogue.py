"""GEMM epilogues written in the expression IR: any pointwise chain after a GEMM fuses into it
(not only the epilogue kinds), rendered by the same hook for Triton and ATen."""

from __future__ import annotations

import pytest
import torch

import tilewright
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.inputs import make_inputs, poisoned_output, rel_error
from tilewright.compiler.report import collect_reports
from tilewright.ir import expr as E
from tilewright.ir.epilogue import dumps, input_load, problem_epilogue
from tilewright.compiler.kernel_factory import default_factory
from tilewright.problem import EpilogueInput, GemmProblem
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

CHAINS = {
    "clamp then rsqrt, times a bias": lambda x, w, b: torch.rsqrt((x @ w).clamp(0.1, 3.0) + 1) * b,
    "bias then square": lambda x, w, b: ((x @ w) + b).pow(2) - 1,
    "gelu then clamp": lambda x, w, b: torch.nn.functional.gelu(x @ w + b).clamp(max=0.5),
    "where on the sign": lambda x, w, b: torch.where(x @ w > 0, (x @ w + b) * 0.5, -b),
}


@pytest.mark.parametrize("mode", ["cpp", "triton"])  # auto on a CPU leaves epilogues to loop kernels
@pytest.mark.parametrize("name", list(CHAINS))
def test_a_pointwise_chain_after_a_gemm_is_its_epilogue(name, mode):
    fn = CHAINS[name]
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(9, 16, generator=g), torch.randn(16, 24, generator=g), torch.randn(24, generator=g)
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend=mode, strict=True), collect_reports() as reports:
        out = torch.compile(fn, backend="tilewright")(x, w, b)
    ref = fn(x.double(), w.double(), b.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5
    (report,) = reports
    if name != "where on the sign":  # that one reads the product twice (two GEMMs)
        assert report.launches == 1 and report.gemms[0].epilogue.startswith("ir: ")


def _ir_problem() -> GemmProblem:
    # relu(acc) * bias[n] + row[m]: loads along both output dims, so a swapped problem shows
    acc = E.acc()
    value = E.where(E.op("lt", acc, E.const(0.0, "fp32")), 0.0, acc) * input_load(0, "N", "fp32") \
        + input_load(1, "M", "fp32")
    return GemmProblem(M=20, N=36, K=16, dtype="fp32", layout_b="col",
                       epilogue_inputs=(EpilogueInput("N", "fp32"), EpilogueInput("M", "fp32")),
                       epilogue_ir=dumps(value))


@pytest.mark.parametrize("swap_ab", [False, True])
def test_ir_epilogue_kernel_matches_the_reference_including_swap_ab(swap_ab):
    problem = _ir_problem()
    t = get_template("triton.gemm")
    params = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 4, "num_stages": 1,
              "SWAP_AB": swap_ab}
    launch = default_factory.build(problem, Candidate.of(t.id, t.source_hash, params), get_target("cpu"))
    x = make_inputs(problem, "cpu", seed=1)
    out = poisoned_output(problem, "cpu")
    launch(x.a, x.b, *x.epilogue_inputs, out=out)
    assert rel_error(out, default_factory.reference(problem, x)) < 1e-6


def test_ir_epilogues_key_roundtrip_and_swap():
    problem = _ir_problem()
    assert GemmProblem.from_json(problem.to_json()) == problem
    assert problem.stable_hash() != GemmProblem(M=20, N=36, K=16, dtype="fp32", layout_b="col").stable_hash()
    swapped = problem.transposed()
    assert [i.broadcast for i in swapped.epilogue_inputs] == ["M", "N"]
    loads = {n.arg[0]: n.arg[1] for n in E.toposort([problem_epilogue(swapped)]) if n.op == "load"}
    assert {k: tuple(map(str, v)) for k, v in loads.items()} == {"e0": ("m",), "e1": ("n",)}
    assert problem.describe_epilogue().startswith("ir: ")


def test_templates_without_the_hook_refuse_ir_epilogues():
    problem = _ir_problem()
    for tid in ("gluon.gemm_tdm", "cutedsl.gemm_sm90"):
        why = get_template(tid).supports(problem, get_target("hip:gfx1250" if "gluon" in tid else "cuda:sm_90a"))
        assert not why
