"""``tilewright.collect_reports()``: the graph reports of an ordinary ``torch.compile`` call,
reachable from the package's top level (no recompile, unlike ``launch_report``)."""

from __future__ import annotations

import torch

import tilewright


def test_collect_reports_returns_the_compiled_functions_reports():
    torch._dynamo.reset()
    torch.manual_seed(0)
    w = torch.randn(24, 16)

    def f(x):
        return torch.relu(x @ w.t()) * 2.0

    x = torch.randn(8, 16).t().contiguous().t()[:5]  # ragged rows of a column-major buffer
    compiled = torch.compile(f, backend="tilewright")
    assert "collect_reports" in tilewright.__all__
    with tilewright.collect_reports() as reports:
        out = compiled(x)
    assert len(reports) == 1, reports
    report = reports[0]
    assert report.fallback is None and report.kernel_fallbacks == []
    assert report.gemm_nodes == 1 and report.kernel_counts.get("gemm") == 1, report.kernel_counts
    ref = torch.relu(x.double() @ w.double().t()) * 2.0  # the float64 reference
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5
    # a second call of the same layout compiles nothing; a new layout recompiles, and is reported
    with tilewright.collect_reports() as again:
        compiled(x)
    assert again == []
    with tilewright.collect_reports() as recompiled:
        compiled(torch.randn(5, 16))
    assert len(recompiled) == 1 and recompiled[0].graph_id != report.graph_id
