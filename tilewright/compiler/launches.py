"""The launch report of a user's model: :func:`launch_report`.

How many kernels a compiled model launches per call is what tilewright's fusion is judged by
(``docs/architecture.md``, "Measured"), per compiled graph (inference, or training forward and
backward), on two counts:

* **planned**: the kernel graph's nodes: kernels of each problem kind (GEMM, attention,
  reduction, ...) and ATen calls that launch work (views, tuple accesses and allocations are
  free), beside what eager would launch for the same graph (modelled: one per FX op);
* **run**: what one call really runs, counted at run time: each kernel of generated code
  (C++, Triton, ...) once, and every ATen call that runs work, counted by the profiler
  (:mod:`tilewright.compiler.dispatches`), so a kernel whose tuner chose an ATen program (a
  loop kernel as PyTorch operators, ATen's attention or matmul) counts its ATen calls, not one;
  beside it Inductor's generated kernels and extern calls for the same model
  (:mod:`tilewright.demo.inductor`, counted from the wrapper Inductor generates).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from tilewright.compiler.report import GraphReport, collect_reports


def _calls_aten(winner: str) -> bool:
    """Whether a kernel whose chosen candidate is ``winner`` ("<language>.<template>[...]")
    runs as ATen calls (its language says so) rather than as a kernel of its own."""
    from tilewright.runtime.languages import get_language

    try:
        return get_language(winner.split(".", 1)[0]).calls_aten
    except Exception:  # noqa: BLE001 - an unknown language: a kernel of its own
        return False


@dataclass
class GraphRun:
    """What one call of a compiled graph ran: ``kernels`` of generated code per problem kind,
    ``aten_calls`` ATen calls that ran work (those of kernels chosen as ATen programs and the
    graph's own ATen ops), and Inductor's ``inductor_kernels`` and ``inductor_externs`` for
    the same graph (None when Inductor was not run, or its graphs did not line up with ours)."""

    kernels: dict[str, int] = field(default_factory=dict)
    aten_calls: int | None = None
    inductor_kernels: int | None = None
    inductor_externs: int | None = None

    @property
    def total(self) -> int | None:
        return None if self.aten_calls is None else sum(self.kernels.values()) + self.aten_calls

    @property
    def inductor_total(self) -> int | None:
        if self.inductor_kernels is None or self.inductor_externs is None:
            return None
        return self.inductor_kernels + self.inductor_externs


def graph_run(report: GraphReport) -> GraphRun:
    """The generated kernels per kind of one graph (its ATen calls come from the count); a
    kernel that fell back to ATen for every size (``GraphReport.kernel_fallbacks``) runs its
    ATen form, which the count holds, and is no kernel of its own."""
    on_aten = {f.kernel for f in getattr(report, "kernel_fallbacks", ()) if f.bucket is None}
    winners = [(k.node, k.winner, k.kind) for k in (*report.gemms, *report.kernels)]
    return GraphRun(kernels=dict(Counter(kind for node, w, kind in winners
                                         if not _calls_aten(w) and node not in on_aten)),
                    aten_calls=report.aten_dispatches if report.aten_work_calls is None else report.aten_work_calls)


@dataclass
class LaunchReport:
    """Per compiled graph (``graphs``, in compile order) and in total. Planned (the kernel
    graph): ``gemms`` GEMM kernels, ``generated`` loop kernels, ``kinds`` kernels per problem
    kind, ``aten`` ATen calls that launch work, ``launches`` their sum, and ``eager`` the
    launches of the same graphs run op by op. Run (one call, counted): ``runs`` per graph
    (:class:`GraphRun`), ``run`` their total (generated kernels + ATen calls), ``run_aten``
    the ATen calls, ``inductor`` Inductor's kernels + extern calls for the same model
    (``inductor_kernels``, ``inductor_externs``; None without Inductor, ``inductor_error``
    says why). ``fallbacks``: graphs that did not compile or failed at run time (they run on
    ATen; the reason is in each report's ``fallback``); ``kernel_fallbacks``: kernels that
    failed alone and run on ATen (for every size, or for one size bucket since a later call),
    each graph's ``GraphReport.kernel_fallbacks``. Both are read when asked, so they show
    later calls."""

    graphs: list[GraphReport] = field(default_factory=list)
    runs: list[GraphRun] = field(default_factory=list)
    inductor_kernels: int | None = None
    inductor_externs: int | None = None
    inductor_error: str | None = None

    def __post_init__(self) -> None:
        if not self.runs:
            self.runs = [graph_run(g) for g in self.graphs]

    @property
    def gemms(self) -> int:
        return sum(g.gemm_nodes for g in self.graphs)

    @property
    def generated(self) -> int:
        return sum(g.loop_kernels for g in self.graphs)

    @property
    def kinds(self) -> dict[str, int]:
        total: Counter = Counter()
        for g in self.graphs:
            total.update(g.kernel_counts)
        return dict(total)

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
    def run_kernels(self) -> dict[str, int]:
        total: Counter = Counter()
        for r in self.runs:
            total.update(r.kernels)
        return dict(total)

    @property
    def run_aten(self) -> int | None:
        calls = [r.aten_calls for r in self.runs]
        return None if None in calls else sum(calls)  # type: ignore[arg-type]

    @property
    def run(self) -> int | None:
        return None if self.run_aten is None else sum(self.run_kernels.values()) + self.run_aten

    @property
    def inductor(self) -> int | None:
        if self.inductor_kernels is None or self.inductor_externs is None:
            return None
        return self.inductor_kernels + self.inductor_externs

    @property
    def fallbacks(self) -> list[GraphReport]:
        return [g for g in self.graphs if g.fallback is not None]

    @property
    def kernel_fallbacks(self) -> list[Any]:
        """Every :class:`~tilewright.compiler.fallbacks.KernelFallback` of every graph."""
        return [k for g in self.graphs for k in g.kernel_fallbacks]

    def format(self) -> str:
        """A plain-text table: one row per graph and a total, planned kernels per kind, what
        a call ran (generated kernels + ATen calls) and Inductor's kernels + extern calls."""
        from tilewright.kinds import kinds as registered

        lead = registered()[0].name  # the first registered kind's column first (GEMMs), then by name
        kinds = sorted(self.kinds, key=lambda k: (k != lead, k))

        def n(x: int | None) -> str:
            return "-" if x is None else str(x)

        def ran(kernels: dict[str, int], aten: int | None) -> str:
            return "-" if aten is None else f"{sum(kernels.values()) + aten} ({sum(kernels.values())} + {aten})"

        head = ("graph", "planned", *kinds, "ATen", "eager", "ran (kernels + ATen calls)",
                "Inductor (kernels + extern)", "note")
        rows = [head]
        for g, r in zip(self.graphs, self.runs):
            ind = "-" if r.inductor_total is None else f"{r.inductor_total} ({r.inductor_kernels} + {r.inductor_externs})"
            rows.append((f"{g.kind} #{g.graph_id}", str(g.launches), *(str(g.kernel_counts.get(k, 0)) for k in kinds),
                         str(g.extern_ops), str(g.eager_launches), ran(r.kernels, r.aten_calls), ind,
                         _note(g)))
        ind = ("-" if self.inductor is None else f"{self.inductor} ({self.inductor_kernels} + {self.inductor_externs})")
        rows.append(("total", str(self.launches), *(str(self.kinds.get(k, 0)) for k in kinds), str(self.aten),
                     str(self.eager), ran(self.run_kernels, self.run_aten), ind,
                     f"Inductor: {self.inductor_error}" if self.inductor_error else ""))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        return "\n".join(("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]).rstrip()
                         for r in rows)

    def __str__(self) -> str:
        return self.format()

    def to_json(self) -> dict[str, Any]:
        return {"launches": self.launches, "gemms": self.gemms, "generated": self.generated,
                "kinds": self.kinds, "aten": self.aten, "eager": self.eager,
                "run": self.run, "run_kernels": self.run_kernels, "run_aten": self.run_aten,
                "inductor": self.inductor, "inductor_kernels": self.inductor_kernels,
                "inductor_externs": self.inductor_externs, "inductor_error": self.inductor_error,
                "graphs": [g.to_json() | {"run": {"kernels": r.kernels, "aten_calls": r.aten_calls,
                                                   "inductor_kernels": r.inductor_kernels,
                                                   "inductor_externs": r.inductor_externs}}
                           for g, r in zip(self.graphs, self.runs)]}


def launch_report(model: Callable[..., Any], *args: Any, train: bool = False, inductor: bool = True,
                  **kwargs: Any) -> LaunchReport:
    """Compile ``model`` with ``backend="tilewright"``, call it on ``args``/``kwargs`` and
    report the kernel launches per call of every graph compiled: planned (the kernel graph)
    and run (a second call, counted by the profiler), beside Inductor's for the same model.

    Args:
        model: an ``nn.Module`` or a function of tensors.
        args, kwargs: example inputs (their shapes are the ones compiled; dynamic=False).
        train: also run a backward pass (of the sum of the floating outputs), so the training
            forward and backward graphs are reported; inputs and parameters that require grad
            get the gradients of one call, as a normal backward would (the counted call's and
            Inductor's are undone).
        inductor: also compile the model with Inductor and count its kernels and extern calls
            (a C++ build on a CPU: seconds); an Inductor failure is reported in
            ``inductor_error``, not raised.

    Returns:
        A :class:`LaunchReport` (``print(report)`` shows the table; ``report.to_json()``).

    Raises:
        ValueError: ``train`` with no floating output that requires grad.
        RuntimeError: another profiler is running in this process (the run count needs one).

    Compiling resets Dynamo's caches first (``torch._dynamo.reset()``), so graphs compiled
    before are compiled again when next called. The tuner measures candidates as in any
    compilation (set ``tilewright.config`` first, e.g. ``force_backend``); the settings and the
    tuning cache in force are used. With ``config.cudagraphs`` set, each graph's note says why it
    runs without CUDA graphs, or what they recorded and replayed (one call: recorded nothing).
    """
    from tilewright.compiler.dispatches import counting

    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tilewright", dynamic=False)
    leaves = _grad_leaves(model, args, kwargs) if train else []
    with collect_reports() as reports:
        _call(compiled, args, kwargs, train)
        kept = [None if t.grad is None else t.grad.clone() for t in leaves]  # accumulated in place
        with counting(reports):  # a counted call runs the compiled graphs (no graph race round)
            _call(compiled, args, kwargs, train)
        _restore(leaves, kept)
    report = LaunchReport(list(reports))
    if inductor:
        _add_inductor(report, model, args, kwargs, train)
        _restore(leaves, kept)
    return report


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


def _call(compiled: Callable[..., Any], args: tuple, kwargs: dict, train: bool) -> None:
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


def _grad_leaves(model: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    inputs = _tensors(list(args) + list(kwargs.values()))
    return [t for t in params + inputs if t.requires_grad and t.is_leaf]


def _restore(leaves: list[torch.Tensor], grads: list[torch.Tensor | None]) -> None:
    """Put back the gradients of one call (later calls only accumulate more)."""
    for t, g in zip(leaves, grads):
        t.grad = g


def _add_inductor(report: LaunchReport, model: Any, args: tuple, kwargs: dict, train: bool) -> None:
    """Inductor's kernels and extern calls per graph (lined up with ours by compile order
    and kind) and in total."""
    from tilewright.demo.inductor import inductor_counting

    try:
        torch._dynamo.reset()
        with inductor_counting() as (backend, graphs):
            _call(torch.compile(model, backend=backend, dynamic=False), args, kwargs, train)
    except Exception as e:  # noqa: BLE001 - Inductor failing costs its column, not the report
        report.inductor_error = f"{type(e).__name__}: {e}"[:200]
        return
    finally:
        torch._dynamo.reset()
    report.inductor_kernels = sum(g.kernels for g in graphs)
    report.inductor_externs = sum(g.externs for g in graphs)
    if [g.kind for g in graphs] == [g.kind for g in report.graphs]:
        for run, g in zip(report.runs, graphs):
            run.inductor_kernels, run.inductor_externs = g.kernels, g.externs


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
