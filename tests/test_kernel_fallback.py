"""A kernel that fails to build costs that kernel (ATen for it, with a warning), never the graph."""

from __future__ import annotations

import warnings

import pytest
import torch

import tilewright
from tilewright.compiler.report import collect_reports
from tilewright.errors import KernelCompileError
from tilewright.compiler.kernel_factory import TemplateKernelFactory


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


@pytest.mark.parametrize("stage", ["render", "compile"])
def test_fused_group_whose_kernel_fails_runs_its_torch_form(monkeypatch, stage):
    real = getattr(TemplateKernelFactory, stage)

    def broken(self, *args, **kwargs):
        rendered_or_problem = args[0]
        template = getattr(rendered_or_problem, "template_id", None) or getattr(args[1], "template_id", "")
        if str(template).startswith("triton.reduction"):
            raise KernelCompileError(f"injected {stage} failure")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TemplateKernelFactory, stage, broken)
    torch._dynamo.reset()
    x, w = torch.randn(5, 24), torch.randn(24)
    with tilewright.config.patch(force_backend="triton", strict=False), collect_reports() as reports, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(_rms, backend="tilewright")(x, w)
    ref = _rms(x.double(), w.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-6
    assert any("runs on ATen" in str(c.message) and "injected" in str(c.message) for c in caught)
    (report,) = reports
    assert report.fallback is None  # the graph itself compiled
    assert [k.winner for k in report.kernels] == ["aten.reduction"]


def test_strict_mode_raises_the_kernel_failure(monkeypatch):
    def broken(self, rendered):
        raise KernelCompileError("injected compile failure")

    monkeypatch.setattr(TemplateKernelFactory, "compile", broken)
    torch._dynamo.reset()
    with tilewright.config.patch(strict=True), pytest.raises(Exception, match="injected compile failure"):
        torch.compile(_rms, backend="tilewright")(torch.randn(3, 8), torch.randn(8))
