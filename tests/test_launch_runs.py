"""The launch report counts what a call really runs (issue 29, item 2): a kernel chosen as an
ATen program counts the ATen calls it makes, a generated kernel counts once, attention kernels
have their own column, and Inductor's kernels and extern calls for the same model sit beside."""

from __future__ import annotations

import json

import pytest
import torch

import tilewright
from tilewright.compiler.dispatches import counting, does_work


class AttnNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.scaled_dot_product_attention(x, x, x)
        return self.norm(self.proj(y)).relu().softmax(-1)


def _x() -> torch.Tensor:
    return torch.randn(2, 2, 8, 32)


def test_kernels_chosen_as_aten_programs_count_their_aten_calls():
    with tilewright.config.patch(force_backend="aten"):
        report = tilewright.launch_report(AttnNorm(), _x(), inductor=False)
    (g,) = report.graphs
    assert g.kernel_counts.get("attention") == 1, g.kernel_counts  # attention has its row
    assert "attention" in str(report).splitlines()[0]
    # every kernel runs as ATen calls: none counts as a kernel of its own, and the loop
    # kernels' programs make more ATen calls than the one launch each the plan shows
    assert report.run_kernels == {} and report.runs[0].aten_calls == g.aten_work_calls
    # output allocations are counted by the profiler but run no work: not ATen calls here
    assert 0 < g.aten_work_calls < g.aten_dispatches, (g.aten_work_calls, g.aten_dispatches)
    assert report.run_aten > report.launches, (report.run_aten, report.launches)
    assert report.run == report.run_aten
    doc = json.loads(json.dumps(report.to_json()))
    assert doc["run"] == report.run and doc["graphs"][0]["run"]["aten_calls"] == report.run_aten
    assert doc["inductor"] is None


def test_a_generated_kernel_counts_once_and_its_launch_no_aten_calls():
    from tilewright.runtime import cpp

    if (why := cpp.unavailable_reason()) is not None:
        pytest.skip(why)
    model = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.GELU())
    with tilewright.config.patch(force_backend="cpp"):
        report = tilewright.launch_report(model, torch.randn(16, 64), inductor=False)
    (g,) = report.graphs
    assert sum(report.run_kernels.values()) == g.loop_kernels >= 1
    assert report.run == sum(report.run_kernels.values()) + report.run_aten
    assert report.run_aten <= 2 * g.loop_kernels  # at most an output allocation-free cast each


def test_does_work_tells_views_and_allocations_from_work():
    x = torch.randn(4, 4)
    with counting() as n:
        torch.empty(3)
        x.view(16)
        x.t()
        x.to(torch.float64)  # a view-like op that copies inside
        x + 1
    assert n.total == 5 and n.work_per_graph[-1] == 2, n.per_op
    assert not does_work(type("E", (), {"name": "aten::empty_like", "cpu_children": []})())


def test_training_counts_leave_one_calls_gradients():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(4, 8)
    report = tilewright.launch_report(model, x, train=True, inductor=False)
    assert [g.kind for g in report.graphs] == ["forward", "backward"]
    assert all(r.aten_calls is not None for r in report.runs)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    ref.load_state_dict(model.state_dict())
    ref(x).sum().backward()
    torch.testing.assert_close(model[0].weight.grad, ref[0].weight.grad)  # one call's, not two


@pytest.mark.slow
def test_inductors_kernels_and_externs_sit_beside_per_graph():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))
    x = torch.randn(8, 16)
    report = tilewright.launch_report(model, x, train=True)
    assert report.inductor_error is None
    assert report.inductor_kernels >= 2 and report.inductor_externs >= 2  # fused C++ + addmm/mm
    assert all(r.inductor_total is not None for r in report.runs)  # forward and backward lined up
    assert sum(r.inductor_total for r in report.runs) == report.inductor
    assert model[0].weight.grad is not None
    assert "Inductor" in str(report)
