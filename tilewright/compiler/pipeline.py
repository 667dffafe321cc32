"""The whole pipeline for one ATen FX graph, in named, timed stages:

    lower → fuse → select → render → compile → wrap

``lower`` builds the kernel graph (GEMMs, the kernels of other problem kinds such as grouped
GEMMs, and loop nodes in the expression IR for the pointwise ops and reductions), ``fuse`` folds
epilogues into GEMMs and groups loop nodes into kernels, ``select`` has the autotuner choose a
kernel per kernel node of every kind (:mod:`tilewright.kinds`; choices only), ``render``
turns each choice into source, ``compile`` loads it, ``wrap`` generates and loads the Python
wrapper that calls them. Run-time buckets of dynamic sizes and ``tilewright aot`` use the same
stage functions. With ``config.debug_dir`` set, each graph dumps its FX graph, kernel graph,
rendered kernels and wrapper into a folder of its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import itertools
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch.fx as fx

from tilewright._config import config
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.pool import pool_scope
from tilewright.autotune.select import Selection
from tilewright.compiler.prebuild import start_builds
from tilewright.compiler.dispatch import KernelCall
from tilewright.compiler.dispatches import traced
from tilewright.compiler.fallbacks import LoopBuildFailure, contain, fx_ops_launcher, recording, unlower
from tilewright.compiler.graph import FusedNode, KernelGraph, Node
from tilewright.compiler.lower import lower, lower_loop_nodes
from tilewright.compiler.programs import attach_programs
from tilewright.compiler.race import raced
from tilewright.compiler.report import GraphReport, publish
from tilewright.compiler.pdl import apply_pdl, pdl_kernels, with_pdl
from tilewright.compiler.traffic import compiled_cost, eager_cost
from tilewright.compiler.wrapper import WrapperCodegen, WrapperError, load_wrapper
from tilewright.errors import UnknownTargetError
from tilewright.compiler.kernel_factory import default_factory
from tilewright.kinds import ProblemKind, kernel_nodes, kind_of_node, kinds
from tilewright.runtime.targets import Target, detect_target, get_target, host_target
from tilewright.templates import get_template

log = logging.getLogger("tilewright.compiler")
_graph_ids = itertools.count()
_unknown_warned: set[str] = set()  # UnknownTargetError messages already logged


def cpu_target(target: Target) -> Target:
    """``target``, or for the ``cpu`` target the target ``config.cpu_target`` names for CPU
    tensors (``"xpu"``: ``xpu:opencl-cpu``, one language's kernels run on the host's OpenCL
    CPU device: :func:`~tilewright.runtime.targets.host_target`). Where that target's device
    is missing here (:meth:`~tilewright.runtime.targets.Target.unavailable`) that costs one
    warning per reason and process and stays ``cpu``."""
    if target.name != "cpu" or config.cpu_target == target.backend:
        return target
    host = host_target(config.cpu_target)
    why = f"no {config.cpu_target} target runs on CPU tensors" if host is None else host.unavailable()
    if why is not None:
        if why not in _unknown_warned:
            _unknown_warned.add(why)
            log.warning("cpu_target=%r but %s; CPU kernels use the cpu target (ATen)", config.cpu_target, why)
        return target
    return host


def node_target(n: Node) -> Target:
    """The target a kernel node's kernels are generated for (:func:`cpu_target` of its
    device's); raises UnknownTargetError for a device no registered target runs."""
    return cpu_target(detect_target(n.device))


_fusing_for: contextvars.ContextVar[Target | None] = contextvars.ContextVar("tilewright_fusing_for", default=None)


@contextlib.contextmanager
def fusing_for(target: Target) -> Iterator[None]:
    """Within the block the fuse stage decides as for ``target``, not for the graph's device
    (:func:`fuse_target`): ``tilewright aot`` captures on the host the kernels it builds for GPUs."""
    token = _fusing_for.set(target)
    try:
        yield
    finally:
        _fusing_for.reset(token)


def fuse_target(n: Node) -> Target:
    """The target whose policies the fuse stage asks about kernel node ``n``: the one
    :func:`fusing_for` set, else :func:`node_target`'s."""
    return _fusing_for.get() or node_target(n)


def make_call(n: Node, kind: ProblemKind | None = None) -> KernelCall:
    """The wrapper's call for a kernel node of any kind, its kernel not yet chosen."""
    kind = kind or kind_of_node(n)
    if kind is None:
        raise ValueError(f"{n.name} is not a kernel of any registered problem kind")
    problem = kind.problem_of(n)
    fixed = None
    try:
        target = node_target(n)
    except UnknownTargetError as e:
        if str(e) not in _unknown_warned:  # once per device kind, not once per kernel
            _unknown_warned.add(str(e))
            log.warning("%s (first kernel: %s)", e, n.name)
        log.debug("%s runs on ATen: no target for %s", n.name, n.device)
        target = get_target("cpu") if n.device.type == "cpu" else get_target("cuda:sm_90a")
        aten = get_template(kind.aten_template_id(problem))
        fixed = Candidate.of(aten.id, aten.source_hash)
    return KernelCall(n.name, problem, target, default_factory, options=kind.call_options(n), fixed=fixed)


def _or_aten(call: KernelCall, stage: str, what: str, fn: Callable[[], Any],
             fallback: Callable[[], Any]) -> Any:
    """``fn()``; if it raises (and ``config.strict`` is off), warn, record the failure in the
    graph's report (:func:`~tilewright.compiler.fallbacks.contain`) and return ``fallback()``,
    which switches the kernel to its ATen form: one kernel pays for the failure, not the graph."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - any failure of one kernel is contained
        contain(e, call.name, stage, f"{what} ({call.problem.describe()})")
        return fallback()


def _aten_rendered(call: KernelCall, choices: dict, name: str, rendered: dict | None = None):
    """Switch ``name`` to its ATen candidate (torch emitter for loop kernels) and render it."""
    problem, sel = call.choose_aten()
    choices[name] = (problem, sel)
    out = default_factory.render(problem, sel.winner, call.target)
    if rendered is not None:
        rendered[name] = out
    return out


class _Stages:
    def __init__(self, report: GraphReport):
        self.report = report

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.report.stage_seconds[name] = time.perf_counter() - t0


def fuse(kg: KernelGraph, gm: fx.GraphModule, report: GraphReport | None = None) -> None:
    """The fuse stage, in place: epilogues into their GEMMs, then (``config.loop_kernels``) the
    other ops lowered to loop nodes and grouped into loop kernels (``FusedNode``). Shared by the
    JIT and ``tilewright aot`` (:mod:`tilewright.compiler.capture`), so both see the same
    kernels."""
    fused = sum(kind.fuse(kg, gm) for kind in kinds()) if config.fuse_epilogues else 0
    loop_ops = loop_kernels = 0
    if config.loop_kernels:
        loop_ops, loop_kernels = _loop_kernels(kg, gm)
    if report is not None:
        report.fused_nodes, report.loop_ops, report.loop_kernels = fused, loop_ops, loop_kernels


def _loop_kernels(kg: KernelGraph, gm: fx.GraphModule) -> tuple[int, int]:
    """Lower the loop nodes and group them into kernels (each kind's ``schedule`` hook: the loop
    kind's fusion scheduler); (loop nodes, loop kernels). An op
    whose kernel cannot be built is left to ATen and the rest lowered again without it; any
    other failure of the scheduler costs this graph its loop kernels (GEMMs and the kernels of
    other kinds stay generated)."""
    before = list(kg.nodes)
    on_aten: set[str] = set()
    while True:
        try:
            loop_ops = lower_loop_nodes(kg, gm, skip=on_aten)
            loop_kernels = sum(kind.schedule(kg, gm) for kind in kinds())
            attach_programs(kg, gm)  # the ATen ops each kernel replaced: a CPU candidate of its own
            return loop_ops, loop_kernels
        except LoopBuildFailure as e:
            kg.nodes = list(before)
            if e.fx_names <= on_aten:  # no progress: a bug of the scheduler itself
                error: BaseException = e.error
            else:
                for name in sorted(e.fx_names):
                    contain(e.error, name, "fuse", "building its loop kernel")
                on_aten |= e.fx_names
                continue
        except Exception as e:  # noqa: BLE001 - contained to the loop kernels
            kg.nodes = list(before)
            error = e
        contain(error, "loop kernels", "fuse", "grouping the pointwise ops and reductions",
                runs="ATen (every loop op of this graph)")
        return 0, 0


def compile_graph(gm: fx.GraphModule, example_inputs: list[Any], kind: str) -> Callable[[list], Any]:
    """Compile one ATen FX graph into a boxed callable (``call(args_list)``).

    Raises whatever a stage raises; :mod:`tilewright.compiler.backend` turns that into an ATen
    fallback unless ``config.strict`` is set.
    """
    report = GraphReport(next(_graph_ids), kind)
    with recording(report.kernel_fallbacks):  # what each contained kernel failure cost
        fn = _compile(gm, example_inputs, kind, report)
    fn.tilewright_report = report  # type: ignore[attr-defined] - the run-time guard's fallback
    return fn


def _compile(gm: fx.GraphModule, example_inputs: list[Any], kind: str, report: GraphReport) -> Callable:
    stage = _Stages(report)
    report.fx_nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    report.eager_launches, report.eager_bytes = eager_cost(gm)
    with stage("lower"):
        kg = lower(gm)
    with stage("fuse"):
        fuse(kg, gm, report)
    calls: dict[str, KernelCall] = {}
    for n, kind in kernel_nodes(kg):  # (node, its kind) of every kernel, in graph order
        try:
            calls[n.name] = make_call(n, kind)
        except Exception as e:  # noqa: BLE001 - costs that kernel: its ops run on ATen
            contain(e, n.name, "wrap", "building its call")
            unlower(kg, n)
    kernels = kernel_nodes(kg)
    for n, _ in kernels:  # a run-time failure of a bucket is reported with the graph
        calls[n.name].fallbacks = report.kernel_fallbacks
        if isinstance(n, FusedNode):
            calls[n.name].last_resort = functools.partial(fx_ops_launcher, n, gm)
    # a failure in any of the next three stages costs one kernel, which then runs on ATen
    choices: dict[str, tuple[Any, Selection]] = {}
    with stage("select"), pool_scope():  # isolated tuning shares one worker pool per graph
        start_builds(calls.values())  # every problem's C++ candidates build while the first is tuned
        for name, call in calls.items():
            choices[name] = _or_aten(call, "select", "choosing a kernel", call.choose, lambda c=call: c.choose_aten())
    with stage("pdl"):  # which consecutive kernels overlap (compiler/pdl.py)
        try:
            decisions = apply_pdl(kg, calls, choices)
        except Exception as e:  # noqa: BLE001 - a failed decision costs the overlap, not the graph
            if config.strict:
                raise
            log.warning("PDL edges not decided (%s: %s); kernels launch without PDL", type(e).__name__, e)
            decisions = []
        report.pdl_edges = [d.to_json() for d in decisions]
        pdl = pdl_kernels(decisions)
    rendered: dict[str, Any] = {}
    with stage("render"):
        for name, (problem, sel) in choices.items():
            call = calls[name]
            winner = with_pdl(sel.winner) if name in pdl else sel.winner
            rendered[name] = _or_aten(
                call, "render", f"rendering {winner.name}",
                lambda: default_factory.render(problem, winner, call.target),
                lambda: _aten_rendered(call, choices, name))
    with stage("compile"):
        for name, (problem, sel) in choices.items():
            call = calls[name]
            launch = _or_aten(call, "compile", f"compiling {rendered[name].template_id}",
                              lambda: default_factory.compile(rendered[name]),
                              lambda: default_factory.compile(_aten_rendered(call, choices, name, rendered)))
            call.bind(choices[name][0], launch)
    with stage("wrap"):
        fn = _wrap(kg, gm, example_inputs, report, calls, choices, rendered)
    kernels = kernel_nodes(kg)  # less those whose wrapper line failed
    report.extern_nodes = len(kg.nodes) - len(kernels)
    for n, kind in kernels:  # each kind reports its own kernels, into the list its report names
        r = kind.report(n, calls[n.name])
        getattr(report, getattr(r, "section", "kernels")).append(r)
        report.kernel_counts[calls[n.name].kind] = report.kernel_counts.get(calls[n.name].kind, 0) + 1
    report.gemm_nodes = len(report.gemms)  # the GEMM kind's nodes (its reports' section)
    report.extern_ops, report.bytes_moved = compiled_cost(
        kg, {name: int(getattr(c.problem, "min_bytes", 0)) for name, c in calls.items()})
    publish(report)
    return fn


def _wrap(kg: KernelGraph, gm: fx.GraphModule, example_inputs: list[Any], report: GraphReport,
          calls: dict[str, KernelCall], choices: dict, rendered: dict) -> Callable:
    """The wrapper's boxed ``call``. A kernel whose line cannot be written or
    loaded costs that kernel: it is replaced by its FX nodes as ATen calls
    (:func:`~tilewright.compiler.fallbacks.unlower`, recorded at the ``wrap`` stage) and the
    wrapper written again without it; a failure of no kernel's line costs the graph."""
    while True:
        describe = {name: f"{c.problem.describe()} | {choices[name][1].winner.name}" for name, c in calls.items()}
        codegen = WrapperCodegen(kg, gm, describe)
        try:
            source = codegen.generate()
            try:
                compile(source, "<tilewright-wrapper>", "exec")
            except SyntaxError as e:
                raise WrapperError(codegen.owners.get(e.lineno or -1), e) from e
        except WrapperError as e:
            if e.node is None or e.node not in calls:
                raise e.error
            contain(e.error, e.node, "wrap", "writing its wrapper call")
            unlower(kg, next(n for n in kg.nodes if n.name == e.node))
            for table in (calls, choices, rendered):
                table.pop(e.node, None)
            continue
        debug = _dump_or_warn(report, gm, kg, calls, rendered, source) if config.debug_dir else None
        fn = traced(raced(load_wrapper(source, calls, codegen.consts, filename=debug), gm, example_inputs, report),
                    report.graph_id)
        return fn


_RUN = f"run_{time.strftime('%Y%m%d-%H%M%S')}_{os.getpid()}"


def _dump_or_warn(report: GraphReport, gm: fx.GraphModule, kg: KernelGraph,
                  calls: dict[str, KernelCall], rendered: dict, source: str) -> str | None:
    """Dump for humans; a dump that cannot be written costs a warning, never the graph."""
    try:
        return _dump(report, gm, kg, calls, rendered, source)
    except OSError as e:
        log.warning("cannot write the debug dump to %s (%s); compiling without it", config.debug_dir, e)
        return None


def _dump(report: GraphReport, gm: fx.GraphModule, kg: KernelGraph, calls: dict[str, KernelCall],
          rendered: dict, source: str) -> str:
    # one folder per process run, so a second run never overwrites the first one's graphs
    folder = Path(config.debug_dir) / _RUN / f"graph_{report.graph_id:03d}_{report.kind}"
    (folder / "kernels").mkdir(parents=True, exist_ok=True)
    report.debug_dir = str(folder)
    (folder / "fx_graph.py").write_text(gm.print_readable(print_output=False))
    (folder / "kernel_ir.txt").write_text(kg.describe() + "\n")
    for name, call in calls.items():
        r = rendered[name]
        (folder / "kernels" / f"{name}_{r.name}.py").write_text(r.source)
        sel = next(iter(call.selections.values()))
        (folder / "kernels" / f"{name}_selection.json").write_text(json.dumps({
            "problem": call.problem.to_json(), "winner": sel.winner.name, "reason": sel.reason,
            "candidates": [{"name": r.candidate.name, **r.record.to_json()} for r in sel.results],
        }, indent=1))
    path = folder / "wrapper.py"
    path.write_text(source)
    return str(path)
