"""Where a CPU GEMM's epilogue runs (GemmPolicy.fuses_epilogues): in auto mode the loop kernels
take it (a residual add joins the norm after it, as Inductor does on a CPU); a forced backend and
a capture for GPU targets keep it in the GEMM."""

from __future__ import annotations

import torch

import tilewright
from tilewright.compiler.capture import ModelSpec, capture_kernels
from tilewright.compiler.report import collect_reports
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.runtime.targets import get_target


class _Block(torch.nn.Module):
    """A projection whose output is added to the residual and RMS-normalised."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 32, bias=False)
        self.weight = torch.nn.Parameter(torch.rand(32) + 0.5)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = residual + self.proj(x)
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 7, 48, generator=g)[..., 5:37]  # ragged rows, non-contiguous
    return x, torch.randn(3, 7, 32, generator=g)


def _compiled(force_backend: str):
    torch.manual_seed(0)
    block = _Block()
    x, r = _inputs()
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend=force_backend, strict=True, graph_race="off"), \
            collect_reports() as reports, torch.no_grad():
        out = torch.compile(block, backend="tilewright")(x, r)
        ref = block.double()(x.double(), r.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-6
    (report,) = reports
    return report


def test_auto_on_a_cpu_leaves_the_residual_add_to_the_norms_loop_kernel():
    report = _compiled("auto")
    (gemm,) = report.gemms
    assert gemm.epilogue in ("", "-"), gemm.epilogue
    assert report.loop_kernels == 1 and report.launches == 2  # the GEMM, then add+norm in one


def test_a_forced_backend_keeps_the_epilogue_in_the_gemm():
    report = _compiled("cpp")
    (gemm,) = report.gemms
    assert "add" in gemm.epilogue, gemm.epilogue


def test_capture_fuses_as_its_target_does():
    x, r = _inputs()
    spec = ModelSpec(_Block(), (x, r), {}, "block")

    def epilogues(**kw):
        return [c.problem.epilogue for c in capture_kernels(spec, **kw) if isinstance(c.problem, GemmProblem)]

    # the default (and tilewright aot's GPU targets) fuse the residual add into the GEMM ...
    assert all(e for e in epilogues()) and all(e for e in epilogues(target=get_target("cuda:sm_90a")))
    # ... warm/explain for the CPU capture what its compiled models look up
    assert epilogues(target=get_target("cpu")) == [()]
