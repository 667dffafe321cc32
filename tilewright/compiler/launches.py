"""The launch report of a user's model: :func:`launch_report`.

How many kernels a compiled model launches per call is what tilewright's fusion is judged by
(``docs/architecture.md``, "Measured"): GEMMs, generated loop kernels and ATen calls, per
compiled graph (inference, or training forward and backward), beside what eager would launch for
the same graph. Views, tuple accesses and allocations launch nothing and are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from tilewright.compiler.report import GraphReport, collect_reports


@dataclass
class LaunchReport:
    """Per compiled graph (``graphs``, in compile order) and in total: ``gemms`` GEMM kernels,
    ``generated`` loop kernels, ``aten`` ATen calls that launch work, ``launches`` their sum,
    and ``eager`` the launches of the same graphs run op by op. ``fallbacks``: graphs that did
    not compile or failed at run time (they run on ATen; the reason is in each report's
    ``fallback``); ``kernel_fallbacks``: kernels that failed alone and run on ATen (for every
    size, or for one size bucket since a later call), each graph's
    ``GraphReport.kernel_fallbacks``. Both are read when asked, so they show later calls."""

    graphs: list[GraphReport] = field(default_factory=list)

    @property
    def gemms(self) -> int:
        return sum(g.gemm_nodes for g in self.graphs)

    @property
    def generated(self) -> int:
        return sum(g.loop_kernels for g in self.graphs)

    @property
    def aten(self) -> int:
        return sum(g.extern_ops for g in self.graphs)

    @property
    def launches(self) -> int:
        return sum(g.launches for g in self.graphs)

    @property
    def eager(self) -> int:
        return sum(g.eager_launches for g in self.graphs)

    @property
    def fallbacks(self) -> list[GraphReport]:
        return [g for g in self.graphs if g.fallback is not None]

    @property
    def kernel_fallbacks(self) -> list[Any]:
        """Every :class:`~tilewright.compiler.fallbacks.KernelFallback` of every graph."""
        return [k for g in self.graphs for k in g.kernel_fallbacks]

    def format(self) -> str:
        """A plain-text table: one row per graph and a total."""
        rows = [("graph", "launches", "GEMMs", "generated", "ATen", "eager", "note")]
        for g in self.graphs:
            rows.append((f"{g.kind} #{g.graph_id}", str(g.launches), str(g.gemm_nodes), str(g.loop_kernels),
                         str(g.extern_ops), str(g.eager_launches),
                         _note(g)))
        rows.append(("total", str(self.launches), str(self.gemms), str(self.generated), str(self.aten),
                     str(self.eager), ""))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        return "\n".join(("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]).rstrip()
                         for r in rows)

    def __str__(self) -> str:
        return self.format()

    def to_json(self) -> dict[str, Any]:
        return {"launches": self.launches, "gemms": self.gemms, "generated": self.generated,
                "aten": self.aten, "eager": self.eager, "graphs": [g.to_json() for g in self.graphs]}


def launch_report(model: Callable[..., Any], *args: Any, train: bool = False, **kwargs: Any) -> LaunchReport:
    """Compile ``model`` with ``backend="tilewright"``, call it once on ``args``/``kwargs``
    and report the kernel launches per call of every graph compiled.

    Args:
        model: an ``nn.Module`` or a function of tensors.
        args, kwargs: example inputs (their shapes are the ones compiled; dynamic=False).
        train: also run a backward pass (of the sum of the floating outputs), so the training
            forward and backward graphs are reported; inputs and parameters that require grad
            get gradients as a normal backward would.

    Returns:
        A :class:`LaunchReport` (``print(report)`` shows the table; ``report.to_json()``).

    Raises:
        ValueError: ``train`` with no floating output that requires grad.

    Compiling resets Dynamo's caches first (``torch._dynamo.reset()``), so graphs compiled
    before are compiled again when next called. The tuner measures candidates as in any
    compilation (set ``tilewright.config`` first, e.g. ``force_backend``); the settings and the
    tuning cache in force are used. With ``config.cudagraphs`` set, each graph's note says why it
    runs without CUDA graphs, or what they recorded and replayed (one call: recorded nothing).
    """
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tilewright", dynamic=False)
    with collect_reports() as reports:
        if train:
            out = compiled(*args, **kwargs)
            flat = [t for t in _tensors(out) if t.is_floating_point() and t.requires_grad]
            if not flat:
                raise ValueError("launch_report(train=True): the model returned no floating tensor that "
                                 "requires grad; pass inputs or parameters with requires_grad=True")
            sum(t.float().sum() for t in flat).backward()
        else:
            with torch.no_grad():
                compiled(*args, **kwargs)
    return LaunchReport(list(reports))


def _note(g: GraphReport) -> str:
    if g.fallback:
        notes = [f"fell back to ATen: {g.fallback}"]
    elif g.kernel_fallbacks:
        notes = [f"{len(g.kernel_fallbacks)} kernel fallback(s): " + "; ".join(
            k.describe() for k in g.kernel_fallbacks)]
    else:
        notes = []
    cg = g.cudagraphs
    if cg and cg.get("status") == "refused":
        notes.append(f"no CUDA graphs: {cg['reason']}")
    elif cg:
        notes.append(f"CUDA graphs: {cg['recordings']} recorded, {cg['replays']} replays")
    return "; ".join(notes)


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    if hasattr(out, "to_tuple"):  # transformers' ModelOutput
        return _tensors(out.to_tuple())
    return []
